"""Runs in child processes for the W&B tests (a kill -9 needs one): synthetic metrics rows written by
``pods.metrics.MetricsLogger`` (``start``), or the real loop stopped by a signal at a chosen step (``start_loop``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from pods.metrics import MetricsLogger
from pods.schema import check
from support.config import ROOT, compose, shrink


def wandb_cfg() -> dict:
    cfg = shrink(compose(["algorithm.n=4", "algorithm.m=2", "logger=wandb"]))
    cfg["logger"] = {"name": "wandb", "mode": "offline", "project": "pods-test", "tags": ["mine"]}
    return cfg


def write_rows(run_dir: str, cfg: dict, first: int, last: int, resume: int | None, kill: bool, tables: bool = True) -> None:
    """One start of a run: steps first..last (an eval every 2 steps, with 20 completions before it unless not
    ``tables``), then a clean close, or SIGKILL of this process (the logger never closes)."""
    logger = MetricsLogger(run_dir, check(cfg), resume_step=resume)
    if first == 0:
        logger.log({"kind": "setup", "step": 0, "train_prompts": 40, "model_dir": "tiny"})
    for s in range(first, last + 1):
        if s:
            logger.log({"kind": "train", "step": s, "train_time": 1.5 * s, "loss": 1 / s, "reward_mean_all": 0.1 * s})
        if s % 2 == 0 and tables:
            logger.log_completions(
                [{"prompt": f"q{i}", "completion": f"a{i}", "gold": "4", "reward": 1.0, "correct": i % 2 == 0} for i in range(20)]
            )
        if s % 2 == 0:
            logger.log({"kind": "eval", "step": s, "train_time": 1.5 * s, "accuracy": (s % 5) / 5, "both_accuracy": 0.1, "reward": 0.3})
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)
    logger.close()


def start(run_dir: Path, cfg: dict, first: int, last: int, resume: int | None = None, kill: bool = False, tables: bool = True) -> int:
    """``write_rows`` in a child process; its exit code."""
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); from support.wandb_runs import write_rows; "
        f"write_rows({str(run_dir)!r}, json.loads({json.dumps(cfg)!r}), {first}, {last}, {resume}, {kill}, {tables})"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=300).returncode


def train_until(run_dir: str, cfg: dict, at_call: int | None, signum: int) -> None:
    """``pods.loop.train``, sending this process ``signum`` as the ``at_call``-th rollout step of this start begins."""
    import pods.loop.run as loop  # where Run.step finds rollout_step
    from pods.config import validate

    real, calls = loop.rollout_step, [0]

    def counted(*a, **k):
        calls[0] += 1
        if calls[0] == at_call:
            os.kill(os.getpid(), signum)
        return real(*a, **k)

    loop.rollout_step = counted
    loop.train(validate(cfg), run_dir)


def start_loop(run_dir: Path, cfg: dict, at_call: int | None = None, signum: int = signal.SIGUSR1) -> subprocess.CompletedProcess:
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); from support.wandb_runs import train_until; "
        f"train_until({str(run_dir)!r}, json.loads({json.dumps(cfg)!r}), {at_call}, {int(signum)})"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
