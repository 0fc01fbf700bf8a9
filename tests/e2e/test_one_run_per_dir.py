"""A run directory holds one run, through ``python -m pods.train`` (in-process, ``support.doors``): a fresh run into a
directory that holds a run is refused in one line before anything is written, ``train.start_over=true`` moves the old
run aside (never deletes it); a resume that finds trained rows but no checkpoint is refused instead of dropping them;
a config error found once the run started leaves no run directory behind; the sweep folders leave out the keys a
resume may change; a finished sweep run again (plain, then ``train.resume=auto``) changes no file, and an interrupted
one finishes only what is left."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pods.compose import compose_plain
from pods.metrics import read_metrics
from pods.resume import MAY_CHANGE, flat
from support.doors import door
from support.runs import TINY_STEPS, copy_run, one_line, snapshot

SHORT = [*TINY_STEPS, "train.prompts_per_step=1", "train.max_steps=2"]


def train(*args) -> object:
    flags = [a for a in args if a == "-m"]  # Hydra reads its flags before the overrides
    return door("pods.train", [*flags, *SHORT, *(a for a in args if a != "-m")])


@pytest.fixture(scope="module")
def finished(tiny_dir, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("one_run") / "run"
    p = train(f"hydra.run.dir={run_dir}")
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir


def test_a_fresh_run_into_a_run_directory_is_refused_in_one_line_and_nothing_is_written(finished, tmp_path):
    """It used to train again and append to metrics.jsonl (two setup rows, two step-0 evaluations)."""
    run_dir = copy_run(finished, tmp_path)
    before = snapshot(run_dir)
    for extra in ([], ["seed=1"]):  # the same settings, or others (which also overwrote config.json)
        line = one_line(train(f"hydra.run.dir={run_dir}", *extra))
        assert line.startswith(f"pods: config error: {run_dir} already holds a run (config.json, metrics.jsonl"), line
        assert "trained to step 2" in line and "train.resume=auto continues it" in line and "another directory" in line
        assert "train.start_over=true" in line
        assert snapshot(run_dir) == before  # not even Hydra's .hydra/ files


def test_start_over_moves_the_old_run_aside_and_starts_a_new_one(finished, tmp_path):
    run_dir = copy_run(finished, tmp_path)
    before = snapshot(run_dir)
    p = train(f"hydra.run.dir={run_dir}", "train.start_over=true", "train.max_steps=1")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"moved the run in {run_dir} aside to {run_dir}.old1" in p.stderr
    assert snapshot(tmp_path / "run.old1") == before  # the old run, whole
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in rows] == [("setup", 0), ("eval", 0), ("train", 1), ("eval", 1)]  # one run
    line = one_line(train(f"hydra.run.dir={run_dir}", "train.start_over=true", "train.resume=auto"))
    assert "train.start_over=true starts the run again and train.resume continues it: set one" in line


def test_a_resume_with_trained_rows_but_no_checkpoint_is_refused(finished, tmp_path):
    """A run killed before its first checkpoint: resume used to start at step 0 and drop its rows without a word."""
    run_dir = copy_run(finished, tmp_path)
    shutil.rmtree(run_dir / "checkpoints")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if json.loads(line).get("step") == 2)
    (run_dir / "metrics.jsonl").write_text("".join(lines[:cut]))  # killed during step 2
    before = snapshot(run_dir)
    line = one_line(train(f"hydra.run.dir={run_dir}", "train.resume=auto"))
    assert line == (
        f"pods: config error: train.resume: {run_dir} trained to step 1 but holds no checkpoint to continue from (it would "
        "start at step 0 and drop the rows logged so far): train.start_over=true without train.resume moves it aside and "
        "starts again"
    )
    assert snapshot(run_dir) == before


def test_a_config_error_found_after_the_run_started_leaves_no_run_directory(tmp_path):
    """A dataset file with the wrong columns is found when the run loads it: that used to leave config.json and an
    empty train.log, so a later resume was refused as "ran with other settings" and a later plain run overwrote it."""
    (tmp_path / "train.jsonl").write_text(json.dumps({"q": "1 + 1", "a": "2"}) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "1 + 1", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    data = ["dataset=gsm8k", f"dataset.train_files={tmp_path / 'train.jsonl'}", f"dataset.test_files={tmp_path / 'test.jsonl'}"]
    p = train(*data, f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2 and "none of the fields ['question']" in p.stderr.strip().splitlines()[-1], p.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["train.max_staleness=100"], "train.max_staleness must be <= train.max_steps (2), got 100: no row of a 2-step run"),
        (
            ["train.group_filter=nonzero_std", "train.refill_batches=1000000"],
            "train.refill_batches must be <= 32, got 1000000: each is one more generation of the step's prompts",
        ),
        (["seed=4294967296"], "seed must be <= 2147483647, got 4294967296"),  # it used to say 2.14748e+09
    ],
)
def test_bounds_are_refused_in_one_line_with_the_reason(tmp_path, args, message):
    line = one_line(train(*args, f"hydra.run.dir={tmp_path / 'run'}"))
    assert line.startswith(f"pods: config error: {message}"), line
    assert not (tmp_path / "run").exists()


def test_a_token_budget_below_one_row_is_warned_in_one_line(tmp_path):
    p = train("hardware.micro_batch_tokens=1", "train.max_steps=1", "eval.at_start=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 0, p.stderr[-3000:]
    warned = [line for line in p.stderr.splitlines() if "hardware.micro_batch_tokens=1 is below one row" in line]
    assert len(warned) == 1 and "a micro-batch of its own" in warned[0], p.stderr[-3000:]


def test_help_prints_the_pods_page_not_hydras_dump():
    from pods.usage import options

    p = door("pods.train", ["--help"])
    assert p.returncode == 0 and p.stdout.startswith("usage: python -m pods.train"), p.stdout[:500]
    assert "== Config ==" not in p.stdout and len(p.stdout.splitlines()) < 80
    flat_text = " ".join(p.stdout.split())
    assert all(name in flat_text for name in options("experiment")) and "train.start_over=true" in p.stdout
    assert "README.md" in p.stdout and "max_staleness" in p.stdout


def test_sweep_folders_leave_out_exactly_the_keys_a_resume_may_change():
    """conf/config.yaml named a job folder by every override, train.resume included: the same sweep with
    train.resume=auto made new folders and trained every run again."""
    from pods.compose import compose_job, hydra_context

    with hydra_context("train"):
        plain = list(compose_job([]).hydra.job.config.override_dirname.exclude_keys)
        swept = list(compose_job(["+sweep=seeds_cpu"]).hydra.job.config.override_dirname.exclude_keys)
    may = {k for ov in ([], ["logger=wandb"]) for k in flat(compose_plain(ov)) if any(k == m or k.startswith(m + ".") for m in MAY_CHANGE)}
    from pods.schema.hardware import Slurm

    may |= {*MAY_CHANGE, *(f"hardware.slurm.{k}" for k in Slurm.model_fields)}
    assert set(plain) == may
    assert set(swept) == may | {"sweep", "experiment", "hydra.launcher.timeout_min"}


@pytest.mark.slow
def test_a_readme_sweep_run_three_times_leaves_every_job_folder_as_its_first_run_wrote_it(tiny_dir, tmp_path):
    """The README's plain ``-m`` sweep (shrunk), run plain, plain again, then with ``train.resume=auto``: the second is
    refused before Hydra writes, the third finds each finished run in its own folder; then a job cut short (its last
    step's rows and checkpoint gone) is the only one a ``train.resume=auto`` run trains."""
    sweep = ["-m", "algorithm.rule=max_variance,max_reward", "seed=0", "train.checkpoint_every_steps=1", f"hydra.sweep.dir={tmp_path}"]
    p = train(*sweep)
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted(d for d in tmp_path.iterdir() if d.is_dir())
    assert [d.name.split("_")[0] for d in jobs] == ["0", "1"] and "rule=max_variance" in jobs[0].name and "rule=max_reward" in jobs[1].name
    assert not any(k in d.name for d in jobs for k in ("max_steps", "time_budget_s", "checkpoint_every_steps"))  # a resume may change them
    first = {d.name: snapshot(d) for d in jobs}
    again = train(*sweep)
    assert "already holds a run" in one_line(again)
    assert {d.name: snapshot(d) for d in jobs} == first
    p = train(*sweep, "train.resume=auto")
    assert p.returncode == 0 and p.stdout.count("is finished (step 2") == 2, p.stdout[-3000:] + p.stderr[-3000:]
    assert sorted(d for d in tmp_path.iterdir() if d.is_dir()) == jobs and {d.name: snapshot(d) for d in jobs} == first
    cut = jobs[1]  # interrupted after step 1's checkpoint
    (cut / "checkpoints" / "step_000002.pt").unlink()
    (cut / "checkpoints" / "latest").write_text("step_000001.pt")
    lines = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cut / "metrics.jsonl").write_text("".join(line for line in lines if json.loads(line)["step"] < 2))
    p = train(*sweep, "train.resume=auto")
    assert p.returncode == 0 and p.stdout.count("is finished (step 2") == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert snapshot(jobs[0]) == first[jobs[0].name]
    assert [r["step"] for r in read_metrics(cut / "metrics.jsonl", "train")] == [1, 2]


@pytest.mark.slow
def test_under_torchrun_a_refusal_is_one_line_from_rank_0_and_every_rank_exits_2(tmp_path):
    """Two ranks refused (a bad key; a fresh run into a directory that holds a run): the line used to be printed once per
    rank. torchrun adds its own report (ChildFailedError, each rank's exit code) and exits 1 (README)."""
    import subprocess
    import sys

    from support.config import ROOT
    from support.harness import free_port, worker_env

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    for bad, says in (["optim.lrr=0.1"], "optim.lrr: unknown key"), (["hydra.run.dir=" + str(tmp_path / "run")], "already holds a run"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
        cmd += ["-m", "pods.train", "hardware=cpu_ddp2_zero3", *SHORT, *bad]
        p = subprocess.run(cmd, cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 1 and p.stderr.count("pods: config error:") == 1 and says in p.stderr, p.stderr[-3000:]
        assert "exitcode  : 2" in p.stderr, p.stderr[-3000:]  # torchrun's report of the ranks' own code
