"""Dynamic sampling on 2 DeepSpeed ZeRO-3 ranks (gloo, the tiny model, through ``torchrun -m pods.train``): with
``train.group_filter=nonzero_std``, ``train.refill_batches`` and token-budget micro-batches, every rank generates as
many refill batches and runs as many micro-batches (a rank that did not would hang the next ZeRO-3 collective: the
HF engine generates with the partitioned module), the counts are logged over both ranks, and a resume from the
sharded checkpoint of step 2 logs step 3 as the uninterrupted run did (slow: two torchrun launches)."""

from __future__ import annotations

import pytest

from pods.metrics import read_metrics
from support.harness import torchrun

ARGS = [
    "-m",
    "pods.train",
    "hardware=cpu_ddp2_zero3",
    "algorithm=grpo_pods",
    "algorithm.n=4",
    "algorithm.m=2",
    "train.prompts_per_step=2",
    "train.group_filter=nonzero_std",
    "train.refill_batches=2",
    "hardware.micro_batch_tokens=48",
    "train.max_steps=3",
    "train.time_budget_s=null",
    "train.checkpoint_every_steps=2",
    "eval.max_examples=8",
    "eval.repeats=1",
    "eval.every_s=null",
    "seed=3",
]
TIMING = ("train_time", "t_")


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    pytest.importorskip("deepspeed")
    base = tmp_path_factory.mktemp("refill_ds")
    torchrun([*ARGS, f"hydra.run.dir={base / 'straight'}"], base / "straight.log", timeout=900)
    resume = base / "straight" / "checkpoints" / "step_000002.pt"
    stdout = torchrun([*ARGS, f"hydra.run.dir={base / 'resumed'}", f"train.resume={resume}"], base / "resumed.log", timeout=900)
    return base, stdout


@pytest.mark.slow
def test_two_ranks_filter_refill_and_agree(runs):
    base, _ = runs
    rows = read_metrics(base / "straight" / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 1 <= r["gen_batches"] <= 3 and r["kept"] % (2 * 2) == 0  # both ranks train as many groups of m = 2
        assert r["zero_var_groups"] == pytest.approx(r["groups_filtered"] / (2 * 2 * r["gen_batches"]), abs=1e-6)  # both ranks' groups
        assert r["groups_refilled"] <= r["kept"] // 2
    assert sum(r["gen_batches"] for r in rows) > 3  # refills happened (the tiny model gets many groups all wrong)


@pytest.mark.slow
def test_a_resume_from_step_2_logs_step_3_as_the_uninterrupted_run(runs):
    base, stdout = runs
    assert "resumed from" in stdout and "at step 2" in stdout
    straight = read_metrics(base / "straight" / "metrics.jsonl", "train")[-1]
    resumed = read_metrics(base / "resumed" / "metrics.jsonl", "train")
    assert [r["step"] for r in resumed] == [3]
    same = ("gen_batches", "groups_filtered", "groups_refilled", "kept", "reward_mean_all", "tokens", "tokens_trained")
    assert {k: resumed[0][k] for k in same} == {k: straight[k] for k in same}  # the same prompts, rollouts and refills
