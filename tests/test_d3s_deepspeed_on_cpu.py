"""D3S token selection on 2 DeepSpeed ZeRO-3 ranks (torchrun, gloo, 1 thread each, the tiny model, no mocks).

The worker (this file under torchrun) splits a fixed 8-sequence batch over the 2 ranks (rank r: rows 4r..4r+3),
runs the real entropy pre-pass, keeps the top K of the tokens by |A| x entropy with the threshold gathered over
both ranks, and takes one optimizer step. One process with ``LocalBackend`` and the whole batch must choose the
same tokens (the rank-order tie rule is the batch's row order) and reach the same weights. About 30 s with the
machine loaded (load 5 on 2 cores), so it stays in the default set.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_deepspeed_on_cpu import fixed_batch, torchrun, weights_of

pytestmark = pytest.mark.slow


ARGS = ["algorithm=d3s", "optim.eps=1.0", "optim.max_grad_norm=1.0", "sampling.temperature=0.9"]
PROGRESS, LR = 0.5, 0.5  # K(0.5) = 0.4 of the step's tokens


def worker(out: Path) -> None:
    from conftest import compose
    from pods import distributed, tokens
    from pods.backends.deepspeed import DeepSpeedBackend
    from pods.tiny import ensure_tiny

    cfg = compose(["hardware=cpu_ddp2_zero3", "hardware.micro_batch_size=2", "hardware.deepspeed.stage=3", *ARGS])
    dist = distributed.init(cfg["hardware"])
    backend = DeepSpeedBackend(str(ensure_tiny()), cfg)
    batch = fixed_batch(3).rows(4 * dist.rank, 4 * dist.rank + 4)
    metrics = tokens.apply(batch, backend, cfg["algorithm"], PROGRESS, dist)
    stats = dist.reduce_metrics(backend.update(batch, LR))
    masks = dist.gather_object(batch.loss_mask)
    weights = weights_of(backend)  # a collective under ZeRO-3
    if dist.is_main:
        torch.save({"mask": torch.cat(masks), "metrics": metrics, "stats": stats, "weights": weights}, out / "d3s_zero3.pt")
    print(f"[worker] rank {dist.rank} done", flush=True)
    dist.barrier()


def test_two_rank_d3s_selection_and_update_equal_one_process(tiny_dir, tmp_path):
    from conftest import compose
    from pods import distributed, tokens
    from pods.backends.local import LocalBackend

    torchrun([str(Path(__file__)), str(tmp_path)], tmp_path / "worker.log", timeout=600)
    got = torch.load(tmp_path / "d3s_zero3.pt", weights_only=False)
    cfg = compose(["hardware=cpu", "hardware.micro_batch_size=3", *ARGS])
    local = LocalBackend(str(tiny_dir), cfg)
    batch = fixed_batch(3)
    metrics = tokens.apply(batch, local, cfg["algorithm"], PROGRESS, distributed.SINGLE)
    stats = local.update(batch, LR)
    assert torch.equal(got["mask"], batch.loss_mask)  # the same tokens, chosen over both ranks
    assert 0.35 < metrics["tokens_kept_frac"] < 0.45
    for k in ("tokens_kept_frac", "entropy_kept", "entropy_dropped"):
        assert got["metrics"][k] == pytest.approx(metrics[k], rel=1e-5)
    assert got["stats"]["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-5)
    after = local.model.state_dict()
    assert max((got["weights"][k] - after[k]).abs().max().item() for k in after) < 2e-6


if __name__ == "__main__":  # torchrun ... tests/test_d3s_deepspeed_on_cpu.py OUT_DIR
    worker(Path(sys.argv[1]))
