"""``train.resume`` through the real command line (tiny model on CPU): a finished run resumed stays finished (no new
row, no file changed) and a larger horizon extends it; other settings are refused in one line (exit 2) with the run's
record left alone; a metrics row cut short by a kill mid-write is dropped and the resumed run logs what an
uninterrupted one does; a re-run sweep changes no file of its runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pods.metrics import read_metrics
from support.config import ROOT
from support.doors import Ran, door
from support.runs import TINY_STEPS, copy_run, one_line, snapshot

SHORT = [*TINY_STEPS, "train.prompts_per_step=1"]
TIMING = ("train_time", "t_")  # keys whose values are seconds measured by the clock: the only ones a resume may change


def run(args: list[str], cwd: Path = ROOT) -> Ran:
    """``python -m MODULE ARGS`` or ``python SCRIPT ARGS``, in-process (``support.doors``)."""
    command, rest = (args[1], args[2:]) if args[0] == "-m" else (args[0], args[1:])
    return door(command, rest, cwd=cwd)


def train(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return run(["-m", "pods.train", *SHORT, *extra, f"hydra.run.dir={run_dir}"])


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.fixture(scope="module")
def finished(tiny_dir, tmp_path_factory) -> Path:
    """A run of 2 steps that ended (its final checkpoint, its last evaluation at step 2)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    p = train(run_dir, "train.max_steps=2")
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir


def test_a_finished_run_resumed_stays_finished_and_a_larger_horizon_extends_it(finished, tmp_path):
    """It used to evaluate again at the same step (a second eval row, another accuracy printed as the final one)."""
    run_dir = copy_run(finished, tmp_path)
    before = snapshot(run_dir)
    p = train(run_dir, "train.max_steps=2", "train.resume=auto")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"pods: {run_dir} is finished (step 2, final eval accuracy" in p.stdout and "nothing to do" in p.stdout
    assert snapshot(run_dir) == before  # no row, no evaluation, no checkpoint, not even Hydra's .hydra/ files
    p = train(run_dir, "train.max_steps=3", "train.resume=auto")  # extended on purpose
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in rows if r["kind"] != "setup"] == [
        ("eval", 0),
        ("train", 1),
        ("train", 2),
        ("eval", 2),
        ("train", 3),
        ("eval", 3),
    ]
    assert json.loads((run_dir / "config.json").read_text())["train"]["max_steps"] == 3  # the record says how far it went


@pytest.mark.parametrize(
    "change,named",
    [
        (["algorithm.n=8"], "algorithm.n=4 (now: 8)"),
        (["seed=1"], "seed=0 (now: 1)"),
        (["hardware.deepspeed.stage=2"], "hardware.deepspeed.stage=3 (now: 2)"),
        (
            ["optim.lr=0.001", "sampling.temperature=0.5"],
            "eval.temperature=1.0 (now: 0.5), optim.lr=0.0001 (now: 0.001), sampling.temperature=1.0 (now: 0.5)",
        ),
    ],
)
def test_a_resume_with_other_settings_is_refused_in_one_line_and_the_record_is_kept(finished, tmp_path, change, named):
    """It used to train on with the new settings and overwrite config.json with them (two runs mixed in one record)."""
    run_dir = copy_run(finished, tmp_path)
    before = snapshot(run_dir)
    p = train(run_dir, "train.max_steps=4", "train.resume=auto", *change)
    line = one_line(p)
    assert line.startswith(f"pods: config error: train.resume: {run_dir} ran with other settings: {named}"), line
    assert "a larger train.max_steps or train.time_budget_s extends a run" in line
    assert snapshot(run_dir) == before  # refused before Hydra wrote its .hydra/ files, and config.json is the run's own


def test_a_metrics_row_cut_short_by_a_kill_is_dropped_and_the_resumed_run_logs_what_an_uninterrupted_one_does(tiny_dir, tmp_path):
    """A kill -9 mid-write leaves a partial last line: resume used to fail with a JSONDecodeError traceback, and so did
    compare_runs.py. Here the run is rewound to the state of a kill during step 4's row: the checkpoint of step 2
    is the latest, the rows of steps 3 and half of 4 are written."""
    straight = tmp_path / "straight"
    every2 = ["train.max_steps=4", "train.checkpoint_every_steps=2", "eval.every_steps=2"]  # (two evaluations before the kill: a curve)
    p = train(straight, *every2)
    assert p.returncode == 0, p.stderr[-3000:]
    killed = copy_run(straight, tmp_path)
    (killed / "checkpoints" / "step_000004.pt").unlink()
    (killed / "checkpoints" / "latest").write_text("step_000002.pt")
    lines = (straight / "metrics.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "train" and json.loads(line)["step"] == 4)
    (killed / "metrics.jsonl").write_text("".join(lines[:cut]) + lines[cut][: len(lines[cut]) // 2])
    assert [r["step"] for r in read_metrics(killed / "metrics.jsonl", "train")] == [1, 2, 3]  # the cut row dropped
    p = run(["scripts/compare_runs.py", str(killed), str(straight)])  # the same reader
    assert p.returncode == 0 and "cut short mid-write" in p.stderr, p.stderr[-3000:]
    p = train(killed, *every2, "train.resume=auto")
    assert p.returncode == 0 and "resumed from" in p.stdout + p.stderr, p.stderr[-3000:]
    assert "cut short mid-write" in p.stdout + p.stderr
    resumed, uninterrupted = read_metrics(killed / "metrics.jsonl"), read_metrics(straight / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in resumed] == [(r["kind"], r["step"]) for r in uninterrupted]
    assert untimed(resumed) == untimed(uninterrupted)


def test_a_latest_marker_naming_a_deleted_checkpoint_resumes_from_the_newest_that_exists(tiny_dir, tmp_path):
    """The ``latest`` marker names step 4's checkpoint, which is gone (deleted by hand): resume used to stop with a
    FileNotFoundError traceback; it now says so in one warning and continues from step 2's, as an uninterrupted run."""
    straight = tmp_path / "straight"
    every2 = ["train.max_steps=4", "train.checkpoint_every_steps=2", "eval.every_steps=2"]
    p = train(straight, *every2)
    assert p.returncode == 0, p.stderr[-3000:]
    gone = copy_run(straight, tmp_path)
    (gone / "checkpoints" / "step_000004.pt").unlink()
    assert (gone / "checkpoints" / "latest").read_text().strip() == "step_000004.pt"
    lines = (straight / "metrics.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "train" and json.loads(line)["step"] == 3)
    (gone / "metrics.jsonl").write_text("".join(lines[:cut]))  # a run killed after step 2's checkpoint
    p = train(gone, *every2, "train.resume=auto")
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "names step_000004.pt, which does not exist" in out and "step_000002.pt" in out, out[-3000:]
    assert untimed(read_metrics(gone / "metrics.jsonl")) == untimed(read_metrics(straight / "metrics.jsonl"))


@pytest.mark.slow
def test_running_a_finished_sweep_again_changes_no_file_of_its_runs(tiny_dir, tmp_path):
    """conf/sweep/_base.yaml resumes (train.resume=auto): a re-run sweep used to evaluate every finished run again."""
    args = ["-m", "pods.train", "-m", *SHORT, "train.max_steps=2", "seed=0,1", "train.resume=auto", f"hydra.sweep.dir={tmp_path}"]
    args.append("hydra.sweep.subdir=${hydra.job.num}")  # the same directories whatever the settings (the test of a refusal)
    p = run(args)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = sorted(d for d in tmp_path.iterdir() if d.is_dir())
    assert len(runs) == 2 and all((d / "metrics.jsonl").exists() for d in runs)
    before = {d.name: snapshot(d) for d in runs}
    p = run(args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("is finished (step 2") == 2
    assert {d.name: snapshot(d) for d in runs} == before
    p = run([*args, "optim.lr=0.001"])  # another learning rate in the same directories: refused before Hydra writes there
    assert "optim.lr=0.0001 (now: 0.001)" in one_line(p)
    assert {d.name: snapshot(d) for d in runs} == before


@pytest.mark.slow
def test_a_zero2_run_resumed_under_zero3_is_refused_in_one_line(tiny_dir, tmp_path):
    """Case 7: it used to end in DeepSpeed's AssertionError deep inside load_checkpoint. The run's own record refuses it
    before anything loads; a checkpoint taken out of its run (no config.json to compare) refuses it before its
    shards are read (the checkpoint records its stage)."""
    from support.harness import free_port, torchrun, worker_env

    args = ["-m", "pods.train", "hardware=cpu_ddp2_zero3", "hardware.deepspeed.stage=2", *SHORT, "train.max_steps=1"]
    torchrun([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path / "run.log")
    before = snapshot(tmp_path / "run")

    def again(*extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
        return subprocess.run([*cmd, *args, *extra], cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=600)

    p = again("hardware.deepspeed.stage=3", "train.max_steps=2", "train.resume=auto", f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode != 0 and "hardware.deepspeed.stage=2 (now: 3)" in p.stderr and "AssertionError" not in p.stderr, p.stderr[-3000:]
    assert snapshot(tmp_path / "run") == before
    shutil.copytree(tmp_path / "run" / "checkpoints", tmp_path / "bare" / "checkpoints")
    ckpt = tmp_path / "bare" / "checkpoints" / "step_000001.pt"
    p = again("hardware.deepspeed.stage=3", "train.max_steps=2", f"train.resume={ckpt}", f"hydra.run.dir={tmp_path / 'new'}")
    line = f"pods: config error: train.resume: checkpoint {ckpt} was written under ZeRO stage 2; this run trains under ZeRO stage 3"
    assert p.returncode != 0 and line in p.stderr and "AssertionError" not in p.stderr, p.stderr[-3000:]
