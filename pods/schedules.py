"""Learning-rate schedules as functions of training PROGRESS in [0, 1].

Progress is the fraction of the run's horizon (optimizer steps or training seconds) already used, so the
schedule never depends on how many micro-batches are accumulated per step (the flaw in the authors'
multi-GPU comparison, where the horizon scaled with gradient accumulation).
"""

from __future__ import annotations

import math

from pods.registry import Registry

SCHEDULES = Registry("lr schedule")


def _warmup(progress: float, warmup: float) -> float:
    return min(1.0, progress / warmup) if warmup > 0 else 1.0


@SCHEDULES.register("constant")
def constant(progress: float, warmup: float = 0.0) -> float:
    return _warmup(progress, warmup)


@SCHEDULES.register("cosine")
def cosine(progress: float, warmup: float = 0.0) -> float:
    if progress < warmup:
        return _warmup(progress, warmup)
    frac = min(1.0, (progress - warmup) / max(1e-12, 1 - warmup))
    return 0.5 * (1 + math.cos(math.pi * frac))


@SCHEDULES.register("linear")
def linear(progress: float, warmup: float = 0.0) -> float:
    if progress < warmup:
        return _warmup(progress, warmup)
    return max(0.0, 1 - (progress - warmup) / max(1e-12, 1 - warmup))


# Ramps r(p) in [0, 1] for quantities that move from an initial to a final value as training progresses
# (D3S's (N, K) schedule, pods.d3s.ramped): value = (1 - r) * initial + r * final.
RAMPS = Registry("down-sampling ramp")


@RAMPS.register("linear")
def linear_ramp(progress: float) -> float:
    return progress


@RAMPS.register("cosine")
def cosine_ramp(progress: float) -> float:
    return 0.5 * (1 - math.cos(math.pi * progress))


@RAMPS.register("constant")
def constant_ramp(progress: float) -> float:
    return 0.0


def ramped(start: float, final: float | None, progress: float, ramp: str = "linear") -> float:
    """``(1 - r) * start + r * final`` with ``r = RAMPS[ramp](progress)``; ``final`` None = constant ``start``."""
    if final is None:
        return float(start)
    r = RAMPS.get(ramp)(min(max(float(progress), 0.0), 1.0))
    return (1.0 - r) * float(start) + r * float(final)
