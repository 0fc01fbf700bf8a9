"""Sparse-RL's correction on 2 DeepSpeed ZeRO-3 ranks (torchrun, gloo, 1 thread each, the tiny model, no mocks).

The worker splits a fixed 8-sequence batch over the 2 ranks (rank r: rows 4r..4r+3), gives it sampler
log-probs = the dense policy's + fixed noise (one row vetoed), runs the correction (weights normalised over
both ranks' valid tokens) and one optimizer step. One process with ``LocalBackend`` and the whole batch must
reach the same mask, metrics and weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_deepspeed_on_cpu import fixed_batch, torchrun, weights_of

ARGS = ["algorithm=grpo", "algorithm.correction=sparse_rl", "optim.eps=1.0", "optim.max_grad_norm=1.0"]
LR = 0.5


pytestmark = pytest.mark.slow  # 2 gloo ranks under torchrun (make test-all)


def perturb(batch, backend, rows: slice) -> None:
    """Sampler log-probs = dense + fixed noise (row 5 vetoed), for the rows ``rows`` of the 8-row batch."""
    noise = torch.randn(8, batch.loss_mask.shape[1], generator=torch.Generator().manual_seed(2)) * 0.4
    noise[5, 0] = 12.0
    batch.sampler_logprobs = (backend.policy_stats(batch).logprobs + noise[rows]) * batch.loss_mask


def worker(out: Path) -> None:
    from conftest import compose
    from pods import distributed, tokens
    from pods.backends.deepspeed import DeepSpeedBackend
    from pods.tiny import ensure_tiny

    cfg = compose(["hardware=cpu_ddp2_zero3", "hardware.micro_batch_size=2", "hardware.deepspeed.stage=3", *ARGS])
    dist = distributed.init(cfg["hardware"])
    backend = DeepSpeedBackend(str(ensure_tiny()), cfg)
    batch = fixed_batch(3).rows(4 * dist.rank, 4 * dist.rank + 4)
    perturb(batch, backend, slice(4 * dist.rank, 4 * dist.rank + 4))
    metrics = tokens.apply(batch, backend, cfg["algorithm"], 0.0, dist)
    stats = dist.reduce_metrics(backend.update(batch, LR))
    masks, tw = dist.gather_object(batch.loss_mask), dist.gather_object(batch.token_weights)
    weights = weights_of(backend)  # a collective under ZeRO-3
    if dist.is_main:
        torch.save(
            {"mask": torch.cat(masks), "tw": torch.cat(tw), "metrics": metrics, "stats": stats, "weights": weights}, out / "srl_zero3.pt"
        )
    print(f"[worker] rank {dist.rank} done", flush=True)
    dist.barrier()


def test_two_rank_sparse_rl_correction_and_update_equal_one_process(tiny_dir, tmp_path):
    from conftest import compose
    from pods import distributed, tokens
    from pods.backends.local import LocalBackend

    torchrun([str(Path(__file__)), str(tmp_path)], tmp_path / "worker.log", timeout=600)
    got = torch.load(tmp_path / "srl_zero3.pt", weights_only=False)
    cfg = compose(["hardware=cpu", "hardware.micro_batch_size=3", *ARGS])
    local = LocalBackend(str(tiny_dir), cfg)
    batch = fixed_batch(3)
    perturb(batch, local, slice(0, 8))
    metrics = tokens.apply(batch, local, cfg["algorithm"], 0.0, distributed.SINGLE)
    stats = local.update(batch, LR)
    assert torch.equal(got["mask"], batch.loss_mask) and batch.loss_mask[5].sum() == 0
    assert torch.allclose(got["tw"], batch.token_weights, atol=1e-5)  # normalised over both ranks' tokens
    for k in ("sparse_rl_rejected_frac", "sparse_rl_masked_frac", "sparse_rl_weight_max", "mismatch_kl"):
        assert got["metrics"][k] == pytest.approx(metrics[k], rel=1e-4, abs=1e-6)
    assert got["stats"]["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-5)
    after = local.model.state_dict()
    assert max((got["weights"][k] - after[k]).abs().max().item() for k in after) < 2e-6


if __name__ == "__main__":  # torchrun ... tests/test_sparse_rl_deepspeed_on_cpu.py OUT_DIR
    worker(Path(sys.argv[1]))
