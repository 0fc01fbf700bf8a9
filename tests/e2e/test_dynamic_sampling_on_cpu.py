"""Dynamic sampling, overlong handling, Dr. GRPO and token-budget micro-batches through the command line (tiny model,
toy task, CPU): a run with ``train.group_filter=nonzero_std`` and ``train.refill_batches`` logs ``gen_batches``,
``groups_filtered`` and ``groups_refilled`` consistently with what it trained, and a run killed mid-way and resumed
logs what an uninterrupted one does (the refills' prompt stream and RNG states are in the checkpoint); every knob
composes with PODS and D3S in one run; ``algorithm.mask_truncated`` takes the truncated rows out of the loss; the
defaults log what they logged before these options existed (rows of a run of the main branch, kept here)."""

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

SHORT = ["algorithm.n=4", "algorithm.m=2", "train.time_budget_s=null", "eval.max_examples=8", "eval.repeats=1", "eval.every_s=null"]
REFILL = ["train.prompts_per_step=4", "train.group_filter=nonzero_std", "train.refill_batches=2", "train.max_steps=4"]
TIMING = ("train_time", "t_")


def command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pods.train", *SHORT, *extra, f"hydra.run.dir={run_dir}"]


def train(run_dir: Path, *extra: str) -> Ran:
    """``command(run_dir, *extra)`` in-process (``support.doors``); the killed run below is a real process."""
    p = door("pods.train", command(run_dir, *extra)[3:])
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.fixture(scope="module")
def refilled(tiny_dir, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("refill") / "run"
    train(run_dir, *REFILL, "train.checkpoint_every_steps=1")
    return run_dir


def test_refill_logs_what_it_generated_filtered_and_trained(refilled):
    rows = read_metrics(refilled / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert 1 <= r["gen_batches"] <= 3  # the first batch and at most refill_batches = 2 more
        generated = 4 * r["gen_batches"]
        assert r["zero_var_groups"] == pytest.approx(r["groups_filtered"] / generated, abs=1e-6)  # over every group generated
        trained = r["kept"] // 2  # m = 2 rows per trained group
        assert trained <= min(4, generated - r["groups_filtered"]) and r["groups_refilled"] <= trained
        assert r["gen_batches"] == 1 or r["groups_filtered"] > 0  # a refill only when groups were dropped
        assert r["kept"] == 0 or r["reward_std_kept"] > 0  # no trained group of equal rewards
    assert sum(r["gen_batches"] for r in rows) > 4  # the tiny model gets many groups all wrong: refills happened


@pytest.mark.slow  # several runs through the command line (make test-all)
def test_a_killed_refill_run_resumes_to_what_an_uninterrupted_one_logs(refilled, tmp_path):
    run_dir, env = tmp_path / "killed", {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command(run_dir, *REFILL, "train.checkpoint_every_steps=1"), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 600
    while not (run_dir / "checkpoints" / "step_000002.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # no grace: whatever was being written is cut
    proc.wait()
    done = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "train")]
    assert 2 <= len(done) < 4, done  # killed mid-run
    p = train(run_dir, *REFILL, "train.checkpoint_every_steps=1", "train.resume=auto")
    assert "resumed from" in p.stdout + p.stderr
    resumed, straight = read_metrics(run_dir / "metrics.jsonl"), read_metrics(refilled / "metrics.jsonl")
    assert untimed(resumed) == untimed(straight)


@pytest.mark.slow  # several runs through the command line (make test-all)
def test_every_knob_composes_with_d3s_and_pods(tiny_dir, tmp_path):
    knobs = [
        *REFILL[:3],
        "train.max_steps=2",
        "algorithm.mask_truncated=true",
        "algorithm.overlong_buffer=4",
        "algorithm.loss_agg=seq_mean_token_sum_norm",
        "algorithm.advantage=mean_centered",
        "hardware.micro_batch_tokens=64",
    ]
    for algo in (
        ["algorithm=grpo_pods", "algorithm.n=4", "algorithm.m=2"],
        ["algorithm=d3s", "algorithm.n=4", "algorithm.m=2", "algorithm.m_final=3"],
    ):
        run_dir = tmp_path / algo[0].split("=")[1]
        train(run_dir, *knobs, *algo)
        rows = read_metrics(run_dir / "metrics.jsonl", "train")
        assert len(rows) == 2 and all("reward_overlong" in r and -1.0 <= r["reward_overlong"] <= 0.0 for r in rows)
        assert all(r["tokens_trained"] <= r["tokens"] for r in rows) and any(r["grad_norm"] > 0 for r in rows)


def test_mask_truncated_takes_the_truncated_rows_out_of_the_loss(tiny_dir, tmp_path):
    """The same seed gives the same first step's rollouts; the masked run trains fewer tokens, by whole rows of
    sampling.max_tokens = 4 tokens (a truncated row is exactly that long)."""
    one = ["train.max_steps=1", "train.prompts_per_step=4", "algorithm=grpo", "algorithm.n=4", "algorithm.m=4", "sampling.max_tokens=4"]
    rows = {}
    for mask in ("false", "true"):
        train(tmp_path / mask, *one, f"algorithm.mask_truncated={mask}")
        rows[mask] = read_metrics(tmp_path / mask / "metrics.jsonl", "train")[0]
    assert rows["true"]["truncated"] == rows["false"]["truncated"] > 0
    dropped = rows["false"]["tokens_trained"] - rows["true"]["tokens_trained"]
    assert dropped == 4 * round(rows["true"]["truncated"] * 16)  # every truncated row of the 16 (grpo trains them all)


def test_defaults_log_what_main_logged(tiny_dir, tmp_path):
    """The rows of a 3-step PODS run on main (commit 80732e7, before these options; tests/support/main_rows_80732e7.jsonl),
    timings aside: the new code path (pods.refill, the micro-batch planner) with every option off changes no number.
    Keys logged since then are not compared."""
    want = [json.loads(line) for line in (ROOT / "tests" / "support" / "main_rows_80732e7.jsonl").read_text().splitlines()]
    train(tmp_path / "run", "train.max_steps=3", "train.prompts_per_step=2")
    got = untimed(read_metrics(tmp_path / "run" / "metrics.jsonl"))
    assert len(got) == len(want)
    for g, w in zip(got, untimed(want)):
        assert {k: g.get(k) for k in w if k != "model_dir"} == {k: v for k, v in w.items() if k != "model_dir"}


def test_a_step_whose_every_group_is_filtered_trains_nothing(tiny_dir, tmp_path):
    """One-token answers are never right (binary reward 0 everywhere): every group is dropped, no refill is allowed,
    so the step trains nothing, says so, and the run goes on."""
    none = ["sampling.max_tokens=1", "eval.max_tokens=1", "dataset.recipe=correctness", "train.group_filter=nonzero_std"]
    train(tmp_path / "run", *none, "train.max_steps=2", "train.prompts_per_step=2")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl", "train")
    assert [(r["kept"], r["optimizer_steps"], r["gen_batches"], r["groups_filtered"]) for r in rows] == [(0, 0, 1, 2)] * 2
    assert all(r["reward_mean_all"] == 0.0 and r["zero_var_groups"] == 1.0 for r in rows)
