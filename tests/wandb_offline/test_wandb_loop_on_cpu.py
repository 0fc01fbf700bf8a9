"""W&B offline through the real loop (tiny model, toy task, HF engine): a pre-empted, killed (kill -9) and resumed
training run is one W&B run whose offline records hold every step once; a 2-job multirun is one group of two
runs with readable names and the config's tags; each evaluation carries a small table of completions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pods.metrics import read_metrics
from pods.wandb_log import ASIDE, COMPLETIONS, ID_FILE, TABLE, TIME, offline_history, segments
from support.config import ROOT, compose, shrink
from support.wandb_runs import start_loop as start

pytestmark = pytest.mark.slow  # whole training runs in child processes (about 2-4 min at load 10 on 2 cores)


def loop_cfg(resume: bool) -> dict:
    cfg = shrink(compose(["algorithm.n=4", "algorithm.m=2", "logger=wandb"]), steps=8)
    cfg["logger"] = {"name": "wandb", "mode": "offline", "project": "pods-test"}
    cfg["train"].update(checkpoint_every_steps=2, resume="auto" if resume else None)
    cfg["eval"].update(every_steps=2, repeats=2)  # 8 prompts x 2 = 16 completions per evaluation
    return cfg


def test_preempted_killed_and_resumed_run_is_one_wandb_run(tiny_dir, tmp_path):
    p = start(tmp_path, loop_cfg(resume=False), at_call=2)  # SLURM's warning during step 2: checkpoint at 2, clean exit
    assert p.returncode == 0, p.stderr[-3000:]
    p = start(tmp_path, loop_cfg(resume=True), at_call=6, signum=signal.SIGKILL)  # killed during step 8: checkpoint 6
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    assert max(r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")) == 7
    p = start(tmp_path, loop_cfg(resume=True))  # the requeued job: resumes from step 6, runs 7 again, ends at 8
    assert p.returncode == 0, p.stderr[-3000:]

    rid = (tmp_path / "wandb" / ID_FILE).read_text().strip()
    segs = segments(tmp_path)
    assert len(segs) == 2 and {s.run_id for s in segs} == {rid} and all(s.finished for s in segs)
    assert [d.name.endswith(rid) for d in (tmp_path / ASIDE).iterdir()] == [True]  # the killed start, set aside
    history = offline_history(tmp_path, rid)
    assert [r["_step"] for r in history] == list(range(9))  # every step once, in order
    evals = [r for r in history if "eval/accuracy" in r]
    assert [r["_step"] for r in evals] == [0, 2, 4, 6, 8] and all(TIME in r for r in evals)
    train = {r["step"]: r for r in read_metrics(tmp_path / "metrics.jsonl", "train")}
    assert sorted(train) == list(range(1, 9))
    for r in history[1:]:  # what W&B holds is what metrics.jsonl holds, replayed rows included
        assert r["train/loss"] == train[r["_step"]]["loss"] and r[TIME] == train[r["_step"]]["train_time"]
    tables = [r[TABLE] for r in history if TABLE in r]
    assert tables and all(t["nrows"] == COMPLETIONS < 16 for t in tables)


def test_multirun_is_one_group_of_named_tagged_runs(tiny_dir, tmp_path):
    overrides = ["experiment=toy_pods_64_16_cpu", "algorithm.n=4", "algorithm.m=2", "seed=1,2", "logger=wandb", "logger.tags=[mine]"]
    short = ["train.max_steps=2", "train.time_budget_s=null", "train.prompts_per_step=1", "eval.max_examples=8", "eval.every_s=null"]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    p = subprocess.run(
        [sys.executable, "-m", "pods.train", "-m", *overrides, *short, "eval.every_steps=null", f"hydra.sweep.dir={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    runs = sorted(d for d in tmp_path.iterdir() if (d / "wandb").is_dir())
    assert len(runs) == 2
    meta = [read_run_record(d) for d in runs]
    assert {m.run_group for m in meta} == {"toy_pods_64_16_cpu"} and len({m.run_id for m in meta}) == 2
    assert {m.job_type for m in meta} == {"grpo_pods"}
    assert sorted(m.display_name for m in meta) == [f"grpo_pods n=4 m=2 max_variance seed={s}" for s in (1, 2)]
    for m in meta:
        assert {"mine", "grpo_pods", "max_variance", "toy_pods_64_16_cpu", "tiny", "toy_arith"} <= set(m.tags)
        config = {i.key: json.loads(i.value_json) for i in m.config.update}  # the resolved config is the run's config
        assert config["algorithm"]["n"] == 4 and config["seed"] in (1, 2) and config["logger"]["tags"] == ["mine"]


def read_run_record(run_dir: Path):
    """The run record (id, group, job type, name, tags, config) of the run directory's one offline segment."""
    from pods.wandb_log import records

    (seg,) = segments(run_dir)
    return next(r.run for f in seg.path.glob("*.wandb") for r in records(f) if r.WhichOneof("record_type") == "run")
