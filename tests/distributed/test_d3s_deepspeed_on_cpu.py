"""D3S token selection on 2 DeepSpeed ZeRO-3 ranks (torchrun, gloo, 1 thread each, the tiny model, no mocks).

The worker (this file under torchrun) splits a fixed 8-sequence batch over the 2 ranks (rank r: rows 4r..4r+3),
runs the real entropy pre-pass, keeps the top K of the tokens by |A| x entropy with the threshold gathered over
both ranks, and takes one optimizer step. One process with ``LocalBackend`` and the whole batch must choose the
same tokens (the rank-order tie rule is the batch's row order) and reach the same weights (tests/support/harness.py).
"""

from __future__ import annotations

import pytest

from support.harness import assert_two_ranks_equal_one, fixed_batch, two_ranks_and_one, worker_main

pytestmark = pytest.mark.slow


ARGS = ["algorithm=d3s", "optim.eps=1.0", "optim.max_grad_norm=1.0", "sampling.temperature=0.9"]
PROGRESS, LR = 0.5, 0.5  # K(0.5) = 0.4 of the step's tokens


def d3s_step(backend, cfg, dist, rows: slice) -> dict:
    """Select tokens over every rank's rows, then one update."""
    from pods import tokens

    batch = fixed_batch(3).rows(rows.start, rows.stop)
    metrics = tokens.apply(batch, backend, cfg.algorithm, PROGRESS, dist)
    stats = dist.reduce_metrics(backend.update(batch, LR))
    return {"metrics": metrics, "stats": [stats], "rows": {"mask": batch.loss_mask}}


def test_two_rank_d3s_selection_and_update_equal_one_process(tiny_dir, tmp_path):
    got, want = two_ranks_and_one(__file__, tmp_path, tiny_dir, d3s_step, ARGS)
    # the same tokens, chosen over both ranks; grad norm and weights up to the float32 reduction order of the two layouts
    assert_two_ranks_equal_one(got, want, weights_tol=2e-6, grad_rel=1e-5)
    assert 0.35 < want["metrics"]["tokens_kept_frac"] < 0.45
    for k in ("tokens_kept_frac", "entropy_kept", "entropy_dropped"):
        assert got["metrics"][k] == pytest.approx(want["metrics"][k], rel=1e-5)


if __name__ == "__main__":  # torchrun ... tests/distributed/test_d3s_deepspeed_on_cpu.py OUT_DIR
    worker_main(d3s_step, ARGS)
