"""Every door answers bad input in one line with exit code 2, before any work, and no command destroys its input or
committed results (issue 35, cases 4, 5, 10-13): ``python -m pods.grade``, ``python -m pods.memory``,
``python -m pods.train``'s output folder and ``scripts/*.py``, each run in-process through its ``main(argv)`` or as
``__main__`` (``support.doors``); the real processes of these commands are tested once each
(``test_real_processes`` here and in ``unit/test_bad_inputs.py``, ``tasks/test_tasks_cli.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support.config import ROOT
from support.doors import Ran, door

SCRIPTS = ROOT / "scripts"


def run(args: list, cwd: Path = ROOT) -> Ran:
    """``python -m MODULE ARGS`` or ``python SCRIPT ARGS`` (``args`` as the command line has them), in-process."""
    command, rest = (args[1], args[2:]) if args[0] == "-m" else (args[0], args[1:])
    return door(command, rest, cwd=cwd)


def refused(p: Ran, line: str) -> None:
    """Exit code 2 and ``line`` as stderr's last line, no traceback."""
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1] == line


def unwritable() -> Path:
    """A folder nobody, root included, can create files in (sysfs); the test skips where there is none."""
    try:
        fd, probe = tempfile.mkstemp(dir="/sys")
    except OSError:
        return Path("/sys")
    os.close(fd)
    os.unlink(probe)
    pytest.skip("no read-only folder here (/sys is writable)")


GOOD = {"completion": "so the answer is 7", "answer": "7"}


# ---- pods-grade ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["same", "symlink", "relative"])
def test_grade_refuses_to_write_over_its_input(tmp_path, how):
    src = tmp_path / "c.jsonl"
    text = json.dumps(GOOD) + "\n"
    src.write_text(text)
    out = {"same": src, "symlink": tmp_path / "link.jsonl", "relative": Path("..") / tmp_path.name / "c.jsonl"}[how]
    if how == "symlink":
        out.symlink_to(src)
    p = run(["-m", "pods.grade", "--task", "gsm8k", "--input", src, "--output", out], cwd=tmp_path if how == "relative" else ROOT)
    refused(p, f"pods-grade: error: --output {out} is the input file: grading would overwrite what it reads; name another file")
    assert src.read_text() == text


def test_grade_exits_2_and_writes_nothing_when_every_row_is_malformed(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"completion": 1}\nnot json\n')
    out.write_text("an earlier result\n")
    p = run(["-m", "pods.grade", "--task", "gsm8k", "--input", src, "--output", out])
    refused(p, f"pods-grade: error: nothing to grade in {src}: all 2 rows are malformed (each named above); {out} not written")
    assert out.read_text() == "an earlier result\n" and sorted(x.name for x in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


@pytest.mark.parametrize("where", ["directory", "under_a_file", "unwritable"])
def test_grade_refuses_an_output_it_cannot_write(tmp_path, where):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(GOOD) + "\n")
    out = {"directory": tmp_path, "under_a_file": src / "out.jsonl", "unwritable": None}[where]
    out = out or unwritable() / "pods-doors" / "out.jsonl"
    message = {
        "directory": f"{tmp_path} is a directory, not a file",
        "under_a_file": f"cannot create {out}: {src} is a file, not a directory",
        "unwritable": f"cannot write {out}: making a file in /sys failed (Permission denied)",
    }[where]
    refused(run(["-m", "pods.grade", "--task", "gsm8k", "--input", src, "--output", out]), f"pods-grade: error: --output: {message}")


# ---- python -m pods.memory ----------------------------------------------------------------------------------
@pytest.mark.parametrize("card", ["0", "-5"])
def test_memory_refuses_a_card_without_memory(card):
    p = run(["-m", "pods.memory", "--card-gb", card])
    refused(p, f"pods: config error: --card-gb: a card's memory in GB is a positive number, got {card}")


def test_memory_exits_3_when_the_run_does_not_fit():
    exp = "experiment=gsm8k_qwen3b_pods_h100x8"
    small, card = run(["-m", "pods.memory", exp, "--card-gb", "10"]), run(["-m", "pods.memory", exp])
    assert small.returncode == 3 and "of 10 GB: DOES NOT FIT" in small.stdout, small.stderr
    assert card.returncode == 0 and "GB of 80 GB: fits" in card.stdout, card.stderr


@pytest.mark.parametrize("where", ["file", "unwritable"])
def test_memory_all_refuses_an_out_it_cannot_write(tmp_path, where):
    out = tmp_path / "f" if where == "file" else unwritable() / "pods-doors"
    if where == "file":
        out.write_text("")
    why = f"{out} is a file, not a directory" if where == "file" else "making a file in /sys failed (Permission denied)"
    refused(
        run(["-m", "pods.memory", "--all", "--out", out]),
        f"pods: config error: --out: cannot {'create' if where == 'file' else 'write'} {out / 'estimates.csv'}: {why}",
    )


# ---- python -m pods.train: hydra.run.dir --------------------------------------------------------------------
@pytest.mark.parametrize("where", ["file", "unwritable"])
def test_train_refuses_a_run_dir_it_cannot_write(tmp_path, where):
    run_dir = tmp_path / "f" if where == "file" else unwritable() / "pods-doors" / "run"
    if where == "file":
        run_dir.write_text("")
    p = run(["-m", "pods.train", "experiment=toy_pods_64_16_cpu", f"hydra.run.dir={run_dir}"])
    why = (
        f"{run_dir} is a file, not a directory"
        if where == "file"
        else f"cannot write {run_dir}: making a file in /sys failed (Permission denied)"
    )
    refused(p, f"pods: config error: hydra.run.dir: {why}")


# ---- scripts/ -----------------------------------------------------------------------------------------------
def test_sparse_rl_long_report_without_runs_leaves_the_results_as_they_were(tmp_path):
    out = tmp_path / "long"
    out.mkdir()
    (out / "summary.csv").write_text("arm,seed\ndense,1\n")
    p = run([SCRIPTS / "sparse_rl_long.py", "report", "--runs", tmp_path / "none", "--out", out])
    refused(
        p,
        f"sparse_rl_long.py: error: no finished run under {tmp_path / 'none'} (a <arm>_s<seed> folder with final_eval.json: "
        f"`run`, then `final`); {out} left as it was",
    )
    assert [x.name for x in out.iterdir()] == ["summary.csv"] and (out / "summary.csv").read_text() == "arm,seed\ndense,1\n"


def write_run(path: Path, evals: list[tuple[int, float]]) -> Path:
    rows = [
        {"kind": "train", "step": s, "train_time": float(s), "zero_var_groups": 0.0, "t_generate": 0.5, "t_update": 0.5}
        for s in range(1, 5)
    ]
    rows += [{"kind": "eval", "step": s, "train_time": float(s), "accuracy": a, "n_eval": 10} for s, a in evals]
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "config.json").write_text(
        json.dumps({"algorithm": {"name": "grpo_pods", "n": 16, "m": 16, "rule": "all", "grad_accum": False}})
    )
    return path


def test_compare_runs_refuses_runs_with_one_evaluation_and_a_csv_it_cannot_write(tmp_path):
    a, b = write_run(tmp_path / "a", [(3, 0.2)]), write_run(tmp_path / "b", [(1, 0.2)])
    refused(
        run([SCRIPTS / "compare_runs.py", a, b]),
        f"compare_runs.py: error: A: the runs at {a} have 1 evaluation with 'accuracy' each: a curve needs two or more",
    )
    good = write_run(tmp_path / "c", [(0, 0.1), (4, 0.3)])
    refused(
        run([SCRIPTS / "compare_runs.py", good, good, "--csv", tmp_path]),
        f"compare_runs.py: error: --csv: {tmp_path} is a directory, not a file",
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["--experiments", "nope"], "experiment: unknown option 'nope'; valid: "),
        (["--args", "nope"], "experiment: unknown option 'nope'; valid: "),
        (["--suites", "nope"], "unknown suite 'nope'; valid: d3s, pods, sparse_rl, toy"),
        (["--args", "suite/nope"], "unknown suite 'nope'; valid: d3s, pods, sparse_rl, toy"),
    ],
)
def test_prefetch_refuses_unknown_names(tmp_path, args, line):
    p = run([SCRIPTS / "prefetch.py", "--dir", tmp_path / "hub", "--check", *args])
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(f"prefetch.py: error: {line}") and not (tmp_path / "hub").exists()


def test_prefetch_refuses_a_dir_it_cannot_write(tmp_path):
    (tmp_path / "f").write_text("")
    refused(
        run([SCRIPTS / "prefetch.py", "--dir", tmp_path / "f", "--check"]),
        f"prefetch.py: error: --dir: {tmp_path / 'f'} is a file, not a directory",
    )


def test_eval_agreement_refuses_an_empty_repository_and_an_unknown_grader(tmp_path):
    (tmp_path / "repo").mkdir()
    out = tmp_path / "out"
    p = run([SCRIPTS / "eval_agreement.py", "--authors-repo", tmp_path / "repo", "--out", out])
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"eval_agreement.py: error: --authors-repo: {tmp_path / 'repo'} is neither a checkout with results/ nor a git directory"
    )
    (tmp_path / "repo" / "results").mkdir()
    p = run([SCRIPTS / "eval_agreement.py", "--authors-repo", tmp_path / "repo", "--out", out])
    refused(p, f"eval_agreement.py: error: --authors-repo: no results/*-Run*.json in {tmp_path / 'repo'}")
    p = run([SCRIPTS / "eval_agreement.py", "--authors-repo", tmp_path / "repo", "--grader", "bogus", "--out", out])
    refused(p, "eval_agreement.py: error: --grader: unknown grader 'bogus' (one of boxed, lenient, math_verify, math_verify_strict, toy)")
    assert not out.exists()


@pytest.mark.parametrize(
    "text, why",
    [
        ("garbage\n", "1: not JSON (Expecting value): not a gaps file written by make test-isa"),
        (
            '{"test": "t", "what": "w"}\n',
            "1: not a gap row (missing or mistyped: measured, tol, isa; a row has test, what, measured, tol, isa)",
        ),
    ],
)
def test_gap_table_refuses_a_file_that_is_not_gap_rows(tmp_path, text, why):
    path = tmp_path / "gaps.jsonl"
    path.write_text(text)
    refused(run([SCRIPTS / "gap_table.py", path]), f"gap_table.py: error: {path}:{why}")


@pytest.mark.slow
def test_real_processes(tmp_path):
    """Real processes, started together (the imports dominate), of the doors no other test launches:
    ``python -m pods.memory`` (exit 3 when the run does not fit), ``scripts/sparse_rl_long.py`` and
    ``scripts/eval_agreement.py`` (a refusal each: exit 2, one line)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # this checkout's pods, from any cwd
    (tmp_path / "repo").mkdir()
    commands = {
        "memory": ["-m", "pods.memory", "experiment=gsm8k_qwen3b_pods_h100x8", "--card-gb", "10"],
        "long": [SCRIPTS / "sparse_rl_long.py", "report", "--runs", tmp_path / "none", "--out", tmp_path / "long"],
        "agreement": [SCRIPTS / "eval_agreement.py", "--authors-repo", tmp_path / "repo", "--out", tmp_path / "out"],
    }
    procs = {
        k: subprocess.Popen(
            [sys.executable, *map(str, a)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for k, a in commands.items()
    }
    done = {k: (p, *p.communicate(timeout=300)) for k, p in procs.items()}
    p, out, err = done["memory"]
    assert p.returncode == 3 and "of 10 GB: DOES NOT FIT" in out, err
    for k in ("long", "agreement"):
        p, out, err = done[k]
        assert (
            p.returncode == 2 and "Traceback" not in err and err.strip().splitlines()[-1].startswith(f"{commands[k][0].name}: error: ")
        ), err
