"""Sparse-RL's correction on 2 DeepSpeed ZeRO-3 ranks (torchrun, gloo, 1 thread each, the tiny model, no mocks).

The worker splits a fixed 8-sequence batch over the 2 ranks (rank r: rows 4r..4r+3), gives it sampler
log-probs = the dense policy's + fixed noise (one row vetoed), runs the correction (weights normalised over
both ranks' valid tokens) and one optimizer step. One process with ``LocalBackend`` and the whole batch must
reach the same mask, metrics and weights (tests/support/harness.py).
"""

from __future__ import annotations

import pytest
import torch

from support.harness import assert_two_ranks_equal_one, fixed_batch, two_ranks_and_one, worker_main

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
    metrics = tokens.apply(batch, backend, cfg["algorithm"], 0.0, dist)
    stats = dist.reduce_metrics(backend.update(batch, LR))
    return {"metrics": metrics, "stats": [stats], "rows": {"mask": batch.loss_mask, "tw": batch.token_weights}}


def test_two_rank_sparse_rl_correction_and_update_equal_one_process(tiny_dir, tmp_path):
    got, want = two_ranks_and_one(__file__, tmp_path, tiny_dir, sparse_rl_step, ARGS)
    assert want["rows"]["mask"][5].sum() == 0  # the vetoed row
    # token weights are normalised over both ranks' tokens: a sum in another order, float32
    assert_two_ranks_equal_one(got, want, weights_tol=2e-6, grad_rel=1e-5, rows_atol={"tw": 1e-5})
    for k in ("sparse_rl_rejected_frac", "sparse_rl_masked_frac", "sparse_rl_weight_max", "mismatch_kl"):
        assert got["metrics"][k] == pytest.approx(want["metrics"][k], rel=1e-4, abs=1e-6)


if __name__ == "__main__":  # torchrun ... tests/distributed/test_sparse_rl_deepspeed_on_cpu.py OUT_DIR
    worker_main(sparse_rl_step, ARGS)
