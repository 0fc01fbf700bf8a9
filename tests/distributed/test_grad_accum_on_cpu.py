"""ZeRO-3 with a bf16 module accumulates micro-batch gradients in float32 (``data_types.grad_accum_dtype``, set by
``pods.backends.deepspeed.ds_config``): on 2 DeepSpeed ranks (gloo, ``hardware=cpu_ddp2_zero3``, the tiny model) the
gradient of 16 micro-batches of one row each is the float32 sum of those 16 micro-batches' own gradients, within
float32 rounding; with DeepSpeed's default (the module's dtype, bf16: what ran before) it is off by bf16 rounding.
Also measured and printed: the relative gap between 1 micro-batch of 16 rows and 16 of 1 row, float32 / bf16 with
bf16 accumulation / bf16 with float32 accumulation (each micro-batch's gradient is bf16 whatever the sum's dtype, so
that gap stays at bf16 rounding; it does not grow with the number of micro-batches any more).

The worker is this file under torchrun (slow): per variant and micro-batch size, ``Backend.update`` with the
optimizer step replaced by a read of DeepSpeed's full float32 gradients (``deepspeed.utils.safe_get_full_grad``);
the per-micro-batch gradients are read after each backward, the accumulation then restarted (``zero_grad``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from support.harness import fixed_batch, torchrun, within

ROWS = 16  # per rank
ARGS = ["hardware=cpu_ddp2_zero3", "algorithm=grpo", "optim.max_grad_norm=null", "sampling.temperature=0.9", "algorithm.beta=0.04"]
VARIANTS = {
    "fp32": ["hardware.dtype=float32"],
    "bf16_accum_bf16": ["hardware.dtype=bfloat16", "+hardware.deepspeed.config.data_types.grad_accum_dtype=bf16"],  # DeepSpeed's default
    "bf16": ["hardware.dtype=bfloat16"],  # pods' config: float32 accumulation
}


def full_grads(backend) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient as DeepSpeed accumulated it, in float32 (a collective: every rank calls it)."""
    from deepspeed.utils import safe_get_full_grad

    return {n: safe_get_full_grad(p).float().cpu().clone() for n, p in backend.engine.module.named_parameters()}


def gradients(overrides: list[str], micro: int, each: bool, dist_rank: int):
    """(accumulated gradient, per-micro-batch gradients) of one update on this rank's 16 rows."""
    from pods.backends.deepspeed import DeepSpeedBackend
    from pods.schema import check
    from pods.tiny import ensure_tiny
    from support.config import compose

    backend = DeepSpeedBackend(str(ensure_tiny()), check(compose([*ARGS, *overrides, f"hardware.micro_batch_size={micro}"])))
    parts, result = [], {}
    real = backend.backward

    def backward(loss):
        real(loss)
        if each:  # this micro-batch's gradient alone, then the accumulation restarts (micro_step_id = 0: copy, not add)
            parts.append(full_grads(backend))
            backend.engine.optimizer.zero_grad()

    def read(lr):
        result.update(full_grads(backend))
        return 0.0

    backend.backward, backend.optimizer_step = backward, read
    backend.update(fixed_batch(0, rows=2 * ROWS).rows(ROWS * dist_rank, ROWS * (dist_rank + 1)), 1.0)
    return result, parts


def worker(out: Path) -> None:
    from pods import distributed
    from pods.schema import check
    from support.config import compose

    dist = distributed.init(check(compose(ARGS)).hardware)
    saved = {}
    for name, overrides in VARIANTS.items():
        saved[name] = {"1x16": gradients(overrides, ROWS, False, dist.rank)[0], "16x1": gradients(overrides, 1, False, dist.rank)[0]}
        if name != "fp32":
            saved[name]["parts"] = gradients(overrides, 1, True, dist.rank)[1]
    if dist.is_main:
        torch.save(saved, out / "grads.pt")


def rel_gap(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over every parameter (float64)."""
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b)
    return (num / sum(float(b[k].double().pow(2).sum()) for k in b)) ** 0.5


def fp32_sum(parts: list[dict]) -> dict:
    """The micro-batches' gradients summed in float32, in their order."""
    out = {k: v.clone() for k, v in parts[0].items()}
    for p in parts[1:]:
        for k in out:
            out[k] += p[k]
    return out


@pytest.fixture(scope="module")
def grads(tmp_path_factory):
    out = tmp_path_factory.mktemp("grad_accum")
    torchrun([__file__, str(out)], out / "worker.log", timeout=900)
    return torch.load(out / "grads.pt", weights_only=False)


@pytest.mark.slow
def test_bf16_micro_batches_sum_in_float32(grads):
    fixed, before = grads["bf16"], grads["bf16_accum_bf16"]
    assert len(fixed["parts"]) == ROWS and rel_gap(fixed["parts"][0], fixed["parts"][1]) > 0.01  # 16 different gradients
    within(rel_gap(fixed["16x1"], fp32_sum(fixed["parts"])), 1e-6, "bf16 module, fp32 accumulation vs the fp32 sum")
    assert rel_gap(before["16x1"], fp32_sum(before["parts"])) > 1e-4  # bf16 sums: what the config gave before


@pytest.mark.slow
def test_one_micro_batch_of_16_against_16_of_one(grads):
    gaps = {name: rel_gap(g["16x1"], g["1x16"]) for name, g in grads.items()}
    print("relative gradient gap, 16x1 vs 1x16 rows: " + ", ".join(f"{k} {v:.2e}" for k, v in gaps.items()))
    within(gaps["fp32"], 1e-5, "float32 module: micro-batching changes the gradient by float32 rounding only")
    assert gaps["bf16"] < 0.05 and gaps["bf16_accum_bf16"] < 0.05  # bf16 rounding of each micro-batch's gradient


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
