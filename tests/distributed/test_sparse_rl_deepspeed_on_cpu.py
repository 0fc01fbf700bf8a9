"""Sparse-RL's correction on 2 DeepSpeed ZeRO-3 ranks (torchrun, gloo, 1 thread each, the tiny model, no mocks).

The worker splits a fixed 8-sequence batch over the 2 ranks (rank r: rows 4r..4r+3), gives it sampler
log-probs = the dense policy's + fixed noise (one row vetoed), runs the correction (weights normalised over
both ranks' valid tokens) and one optimizer step. One process with ``LocalBackend`` and the whole batch must
reach the same mask, metrics and weights (tests/support/harness.py).

``rollout=sparse_hf`` trains on 2 ZeRO-3 ranks from the command line. Every ZeRO-3 forward gathers
parameters from all ranks, so the compressed-KV sampler decodes in lockstep (as many batches and forward calls on
every rank: a rank whose batch is done keeps stepping without sampling, a rank with fewer batches decodes a filler
batch); before, the ranks' different numbers of forwards hung the run (gloo: a size mismatch or a hang; measured
here on the earlier commit: killed after 300 s).
"""

from __future__ import annotations

import pytest
import torch

from support.harness import assert_two_ranks_equal_one, fixed_batch, torchrun, two_ranks_and_one, worker_main

ARGS = ["algorithm=grpo", "algorithm.correction=sparse_rl", "optim.eps=1.0", "optim.max_grad_norm=1.0"]
LR = 0.5


pytestmark = pytest.mark.slow  # 2 gloo ranks under torchrun (make test-all)


def perturb(batch, backend, rows: slice) -> None:
    """Sampler log-probs = dense + fixed noise (row 5 vetoed), for the rows ``rows`` of the 8-row batch."""
    noise = torch.randn(8, batch.loss_mask.shape[1], generator=torch.Generator().manual_seed(2)) * 0.4
    noise[5, 0] = 12.0
    batch.sampler_logprobs = (backend.policy_stats(batch).logprobs + noise[rows]) * batch.loss_mask


def sparse_rl_step(backend, cfg, dist, rows: slice) -> dict:
    """The correction over every rank's rows, then one update."""
    from pods import tokens

    batch = fixed_batch(3).rows(rows.start, rows.stop)
    perturb(batch, backend, rows)
    metrics = tokens.apply(batch, backend, cfg.algorithm, 0.0, dist)
    stats = dist.reduce_metrics(backend.update(batch, LR))
    return {"metrics": metrics, "stats": [stats], "rows": {"mask": batch.loss_mask, "tw": batch.token_weights}}


def test_two_rank_sparse_rl_correction_and_update_equal_one_process(tiny_dir, tmp_path):
    got, want = two_ranks_and_one(__file__, tmp_path, tiny_dir, sparse_rl_step, ARGS)
    assert want["rows"]["mask"][5].sum() == 0  # the vetoed row
    # token weights are normalised over both ranks' tokens: a sum in another order, float32
    assert_two_ranks_equal_one(got, want, weights_tol=2e-6, grad_rel=1e-5, rows_atol={"tw": 1e-5})
    for k in ("sparse_rl_rejected_frac", "sparse_rl_masked_frac", "sparse_rl_weight_max", "mismatch_kl"):
        assert got["metrics"][k] == pytest.approx(want["metrics"][k], rel=1e-4, abs=1e-6)


def test_sparse_hf_rollouts_train_on_two_zero3_ranks_from_the_cli(tiny_dir, tmp_path):
    """Compression happens (budget 24 < prompt + 32 tokens) and completions end at different steps on the two ranks,
    in 4 batches of 2 rows per rank and step (the earlier engine hung here; the filler batch of a rank with fewer
    batches is not reached: the loop gives every rank as many rows)."""
    from pods.metrics import read_metrics

    args = ["-m", "pods.train", "hardware=cpu_ddp2_zero3", "rollout=sparse_hf", "rollout.budget=24", "rollout.interval=4"]
    args += ["rollout.max_batch=2", "algorithm=grpo", "algorithm.correction=sparse_rl", "algorithm.n=4", "train.prompts_per_step=2"]
    args += ["train.max_steps=2", "train.time_budget_s=null", "eval.every_s=null", "eval.max_examples=4", "eval.repeats=1"]
    args += ["sampling.max_tokens=32", "eval.max_tokens=32", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    torchrun(args, tmp_path / "torchrun.log", timeout=300)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["kv_saving"] > 0 and r["mismatch_kl"] > 0 for r in train)  # the cache was compressed
    assert rows[-1]["kind"] == "eval" and rows[-1]["n_eval"] == 4


if __name__ == "__main__":  # torchrun ... tests/distributed/test_sparse_rl_deepspeed_on_cpu.py OUT_DIR
    worker_main(sparse_rl_step, ARGS)
