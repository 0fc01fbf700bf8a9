"""``pods-eval --each-checkpoint RUN`` on a real tiny LoRA run with three checkpoints (trained through
``python -m pods.train``): one summary per checkpoint, each the same as ``pods-eval RUN --checkpoint FILE`` gives for
that checkpoint alone, a curve (CSV rows = the summaries, PNG) over them; a rerun evaluates nothing again; the points
(final/ included when no checkpoint holds its step); bad input in one line and exit 2; (slow) one job per checkpoint
through pods.launch's submitit launcher, as local processes (the real SLURM: tests/slurm/test_slurm_eval.py). The
run trains and ``pods-eval`` runs in-process (``support.doors``), but for the submitit launcher's real processes."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from support.doors import Ran, door
from support.runs import python, train_run

SUITE = ["--suite", "toy", "suite.only=[toy_arith]", "suite.benchmarks.toy_arith.size=6", "suite.samples=2", "suite.max_tokens=12"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return train_run(tmp_path_factory.mktemp("each") / "run", "lora")


def pods_eval(args: list[str]) -> Ran:
    """``python -m pods.eval ARGS``, in-process."""
    return door("pods.eval", args)


def summaries(root: Path) -> dict[str, dict]:
    return {
        d.name: json.loads((d / "summary.json").read_text())
        for d in sorted((root / "checkpoints").iterdir())
        if (d / "summary.json").is_file()
    }


def completions(out: Path) -> list[str]:
    return [json.loads(line)["completion"] for line in (out / "samples.jsonl").open()]


def test_each_checkpoint_one_summary_each_and_a_curve_over_them(run, tmp_path):
    out = tmp_path / "out"
    p = pods_eval(["--each-checkpoint", str(run), *SUITE, "--out", str(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    root = out / "eval" / "toy"
    got = summaries(root)
    assert list(got) == ["base", "step_000001", "step_000002", "step_000003"]  # final/ holds step 3's weights: not twice
    for name, s in got.items():  # base: the model the run started from, step 0 of the curve (it used to have no step 0)
        assert s["weights"] == str(run / "checkpoints" / f"{name}.pt") if name != "base" else (Path(s["weights"]) / "config.json").is_file()
    rows = list(csv.DictReader((root / "curve.csv").open()))
    assert [(r["step"], r["benchmark"]) for r in rows] == [(s, b) for s in "0123" for b in ("toy_arith", "macro")]
    for r in rows:
        assert float(r["avg@n"]) == pytest.approx(got[r["checkpoint"]]["benchmarks"]["toy_arith"]["avg@n"], abs=1e-12)
        assert float(r["pass@2"]) == pytest.approx(got[r["checkpoint"]]["macro"]["pass@k"]["2"], abs=1e-12)
    assert (root / "curve.png").read_bytes()[:4] == b"\x89PNG"

    alone = tmp_path / "alone"  # the same checkpoint evaluated on its own: the same completions
    p = pods_eval([str(run), *SUITE, "--checkpoint", "step_000002.pt", "--out", str(alone)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert completions(root / "checkpoints" / "step_000002") == completions(alone / "eval" / "toy")

    before = {f: f.stat().st_mtime_ns for f in root.rglob("summary.json")}
    p = pods_eval(["--each-checkpoint", str(run), *SUITE, "--out", str(out)])
    assert p.returncode == 0 and p.stdout.count("evaluated already") == 4, p.stdout[-2000:]
    assert before == {f: f.stat().st_mtime_ns for f in root.rglob("summary.json")}


def test_the_points_are_the_checkpoints_then_final_unless_a_checkpoint_holds_its_step(run, tmp_path):
    from pods.eval.each import Point, points

    assert [p.name for p in points(run)] == ["base", "step_000001", "step_000002", "step_000003"]
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "checkpoints" / "step_000003.pt").unlink()  # final/ is now the only copy of step 3
    assert points(copy)[-1] == Point("final", 3, None)
    shutil.rmtree(copy / "checkpoints")
    assert points(copy) == [Point("base", 0, "base"), Point("final", 3, None)]


def test_latest_names_the_same_checkpoint_as_in_single_mode(run, tmp_path):
    """``--each-checkpoint --checkpoint latest`` used to be refused ("latest is not a checkpoint of ..."), while the
    single mode accepted it."""
    from pods.eval.each import select

    assert [p.name for p in select(run, "latest")] == [(run / "checkpoints" / "latest").read_text().strip().removesuffix(".pt")]
    assert [p.name for p in select(run, "base")] == ["base"]


def test_bad_input_is_one_line_and_exit_2(run, tmp_path):
    cases = [
        ([str(tmp_path)], "--each-checkpoint needs a pods run directory"),
        ([str(run), "--checkpoint", "step_000009"], "--checkpoint: step_000009 is not a checkpoint of"),
    ]
    for args, message in cases:
        p = pods_eval(["--each-checkpoint", *args, *SUITE, "--out", str(tmp_path / "o")])
        err = p.stderr.strip()
        assert p.returncode == 2 and message in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_one_job_per_checkpoint_through_the_submitit_launcher(run, tmp_path):
    """``--launcher submitit`` with ``PODS_SUBMITIT_CLUSTER=local``: submitit runs each checkpoint's job as a local
    process; each job writes its summary and launch.json, the submitter the curve."""
    out = tmp_path / "out"
    p = python(
        ["-m", "pods.eval", "--each-checkpoint", str(run), *SUITE, "--launcher", "submitit", "--out", str(out)],
        PODS_SUBMITIT_CLUSTER="local",
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    root = out / "eval" / "toy"
    assert list(summaries(root)) == ["base", "step_000001", "step_000002", "step_000003"]
    for d in (root / "checkpoints").glob("step_*"):
        assert json.loads((d / "launch.json").read_text())["status"] == "finished"
    assert len(list((root / "checkpoints" / ".submitit").glob("[0-9]*"))) == 4  # one job each (by its id)
    assert len(list(csv.DictReader((root / "curve.csv").open()))) == 8


def test_a_corrupt_checkpoint_is_one_line_the_others_are_evaluated_and_exit_1(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval"))
    (copy / "checkpoints" / "step_000002.pt").write_bytes(b"not a checkpoint")
    p = pods_eval(["--each-checkpoint", str(copy), *SUITE])
    assert p.returncode == 1, p.stderr[-3000:]
    assert "pods-eval: step_000002: --checkpoint:" in p.stderr and "not evaluated: step_000002" in p.stderr
    root = copy / "eval" / "toy"
    assert list(summaries(root)) == ["base", "step_000001", "step_000003"]
    assert [r["checkpoint"] for r in csv.DictReader((root / "curve.csv").open())] == ["base"] * 2 + ["step_000001"] * 2 + [
        "step_000003"
    ] * 2
