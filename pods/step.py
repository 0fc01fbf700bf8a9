"""The plan of one training step: how many rollouts each prompt group keeps, how many rows a rank trains, and
in which micro-batches. The loop (``pods.loop``) and the memory estimator (``pods.memory``) both read it here, so
the rule is written once.

- GRPO / PODS: ``algorithm.m`` of ``algorithm.n`` kept per group; micro-batches of ``hardware.micro_batch_size``.
- GRPO-GA (``algorithm.grad_accum``): all n kept, trained in micro-batches of ``prompts x algorithm.m`` (the
  paper's "m" is then the micro-batch), one optimizer step.
- D3S (``algorithm.m_final``): the kept count moves from m to m_final along ``algorithm.ramp`` over the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pods.schedules import ramped


@dataclass(frozen=True)
class StepPlan:
    keep: int  # rollouts kept per prompt group (cross-group rules: on average)
    rows: int  # rows this rank trains in the step: prompts x keep
    micro_batch: int  # sequences per forward/backward (memory only: the gradient is the same)


def kept_per_group(alg, progress: float = 0.0) -> int:
    """Rollouts kept per prompt group at training progress ``progress`` in [0, 1]: n for GRPO-GA, else m moved
    toward m_final (null = constant m) along the ramp, rounded half up."""
    if alg.grad_accum:
        return alg.n
    return int(math.floor(ramped(alg.m, alg.m_final, progress, alg.ramp) + 0.5))


def plan(alg, prompts: int, micro_batch_size: int, progress: float = 0.0) -> StepPlan:
    """The step of ``prompts`` prompt groups at ``progress`` (``alg``: the algorithm section)."""
    keep = kept_per_group(alg, progress)
    rows = prompts * keep
    micro = prompts * alg.m if alg.grad_accum else micro_batch_size
    return StepPlan(keep, rows, max(1, min(micro, micro_batch_size, rows)))


def largest_micro_batch(alg, prompts: int, micro_batch_size: int) -> int:
    """The largest micro-batch of the run (its memory peak): the plan at both ends of a ramp."""
    return max(plan(alg, prompts, micro_batch_size, p).micro_batch for p in (0.0, 1.0))
