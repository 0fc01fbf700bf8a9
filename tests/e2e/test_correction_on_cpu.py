"""``algorithm.correction=behaviour_is`` through the command line (tiny model, toy task, CPU, the synchronous loop:
staleness 0): every step logs the weights' stats and the rows' staleness, and with the HF sampler (the trainer's own
policy in float32) the weights are 1 up to the two forwards' rounding; ``algorithm.correction=none`` spelled out logs
bit for bit the rows of a run of the main branch before the correction existed (tests/support/main_rows_80732e7.jsonl);
with ``train.max_staleness=1`` the mismatch diagnostics are logged, and a run without a correction warns once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pods.metrics import read_metrics
from support.config import ROOT
from support.doors import door

# the settings of tests/support/main_rows_80732e7.jsonl (tests/e2e/test_dynamic_sampling_on_cpu.py)
SHORT = ["algorithm.n=4", "algorithm.m=2", "train.time_budget_s=null", "eval.max_examples=8", "eval.repeats=1", "eval.every_s=null"]
STEPS = ["train.max_steps=3", "train.prompts_per_step=2"]
TIMING = ("train_time", "t_")


def train(run_dir: Path, *extra: str) -> list[dict]:
    p = door("pods.train", [*SHORT, *STEPS, *extra, f"hydra.run.dir={run_dir}"])  # python -m pods.train, in-process
    assert p.returncode == 0, p.stderr[-3000:]
    return read_metrics(run_dir / "metrics.jsonl")


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING) and k != "model_dir"} for r in rows]


def test_behaviour_is_run_logs_weights_and_staleness(tiny_dir, tmp_path):
    rows = [r for r in train(tmp_path / "run", "algorithm.correction=behaviour_is", "eval.at_start=false") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["staleness_mean"] == 0.0 and r["staleness_max"] == 0.0  # the synchronous loop
        assert r["bis_weight_mean"] == pytest.approx(1.0, abs=1e-3) and r["bis_weight_max"] < 1.01
        assert r["bis_clipped_frac"] == 0.0 and r["tokens_trained"] > 0


@pytest.mark.slow  # a second run through the command line (make test-all)
def test_correction_none_logs_what_main_logged(tiny_dir, tmp_path):
    want = [json.loads(line) for line in (ROOT / "tests" / "support" / "main_rows_80732e7.jsonl").read_text().splitlines()]
    got = untimed(train(tmp_path / "run", "algorithm.correction=none"))
    assert len(got) == len(want)
    for g, w in zip(got, untimed(want)):
        assert {k: g.get(k) for k in w} == w


def test_staleness_1_logs_the_mismatch_and_warns_without_a_correction(tiny_dir, tmp_path):
    """k = 1 and no correction: the one-line warning in train.log, once; ``mismatch_k3`` and ``log_ppl_gap`` beside
    ``sampler_gap`` in metrics.jsonl and under ``train/`` in the W&B row (``pods.wandb_log.flat``)."""
    from pods.wandb_log import flat

    rows = [r for r in train(tmp_path / "run", "train.max_staleness=1", "eval.at_start=false") if r["kind"] == "train"]
    warned = [x for x in (tmp_path / "run" / "train.log").read_text().splitlines() if "with algorithm.correction=none" in x]
    assert len(warned) == 1 and "train.max_staleness=1" in warned[0]
    for r in rows:
        assert r["mismatch_k3"] >= 0 and r["log_ppl_gap"] == r["log_ppl_gap"] and r["sampler_gap"] >= 0
    assert any(r["mismatch_k3"] > 1e-6 for r in rows[1:])  # batches 2, 3: one version stale (the lr moves the policy)
    assert {"train/mismatch_k3", "train/log_ppl_gap"} <= set(flat(rows[-1]))


def test_masked_sequence_correction_at_staleness_1(tiny_dir, tmp_path):
    over = ["algorithm.correction=behaviour_is", "algorithm.correction_mode=mask", "algorithm.correction_level=sequence"]
    rows = [r for r in train(tmp_path / "run", "train.max_staleness=1", *over, "eval.at_start=false") if r["kind"] == "train"]
    assert "with algorithm.correction=none" not in (tmp_path / "run" / "train.log").read_text()
    assert [r["staleness_max"] for r in rows] == [0, 1, 1]
    for r in rows:
        assert 0 < r["bis_weight_mean"] <= 2.0 and 0 <= r["bis_clipped_frac"] <= 1 and r["mismatch_k3"] >= 0
