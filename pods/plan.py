"""The plan of one training step: how many rollouts each prompt group keeps, how many rows a rank trains, and
in which micro-batches. The loop (``pods.loop``), the backends' micro-batching and the memory estimator
(``pods.memory``) all read it here, so the rule is written once.

- GRPO / PODS: ``algorithm.m`` of ``algorithm.n`` kept per group; micro-batches of ``hardware.micro_batch_size``.
- GRPO-GA (``algorithm.grad_accum``): all n kept, trained in micro-batches of ``prompts x algorithm.m`` (the
  paper's "m" is then the micro-batch), one optimizer step.
- Token-budget micro-batches (``hardware.micro_batch_tokens``): the rows sorted by length and cut by padded tokens
  (``token_micro_batches``), as many on every rank (``split_to``); ``token_budget_rows`` is the memory estimate's view.
- D3S (``algorithm.m_final``): the kept count moves from m to m_final along ``algorithm.ramp`` over the run.
- Which rows: the loop's steps (4)-(5) (``pods.loop.rollouts``: ``select_rows`` and ``Rows.take``) read ``keep``.
- Mini-batches (``algorithm.mini_batch_size``): the kept rows are cut into consecutive mini-batches, one optimizer
  step each (per ``algorithm.ppo_epochs`` pass); null = one mini-batch of all rows. The learning rate of each
  optimizer step follows the schedule between this rollout step's progress and the next's (``step_lr``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pods.schedules import SCHEDULES, ramped


@dataclass(frozen=True)
class StepPlan:
    keep: int  # rollouts kept per prompt group (cross-group rules: on average)
    rows: int  # rows this rank trains in the step: prompts x keep
    micro_batch: int  # sequences per forward/backward (memory only: the gradient is the same)
    optimizer_steps: int = 1  # mini-batches x ppo epochs


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
    steps = len(mini_batch_bounds(rows, alg.mini_batch_size)) * alg.ppo_epochs
    return StepPlan(keep, rows, max(1, min(micro, micro_batch_size, rows, alg.mini_batch_size or rows)), steps)


def mini_batch_bounds(rows: int, size: int | None, groups: list[int] | None = None) -> list[tuple[int, int]]:
    """The (start, stop) rows of each optimizer step's mini-batch: consecutive chunks of ``size`` rows (the last may
    be shorter; ``size`` None = one chunk of all). Every rank has the same row count, so the same number of chunks
    (ZeRO-3 lockstep). ``groups`` (the prompt group of each row, for a loss that normalises per group: bnpo): every
    cut must fall between two groups, else ValueError (the schema asks for a multiple of m)."""
    size = size or rows or 1
    bounds = [(lo, min(lo + size, rows)) for lo in range(0, rows, size)] or [(0, 0)]
    if groups is not None and any(groups[hi - 1] == groups[hi] for _, hi in bounds[:-1]):
        raise ValueError(f"algorithm.mini_batch_size={size} splits a prompt group, which loss_agg 'bnpo' normalises as a whole")
    return bounds


def step_lr(optim, progress: float, progress_next: float):
    """The learning rate as a function of f in [0, 1), the fraction of this rollout step's optimizer steps done: the
    schedule at ``progress + f (progress_next - progress)`` (the next step's progress by steps; by time it is not
    known in advance and the LR stays at this step's). ``optim``: the optim section."""
    schedule = SCHEDULES.get(optim.schedule)
    return lambda f: optim.lr * schedule(progress + f * (progress_next - progress), optim.warmup_ratio)


def token_micro_batches(prompt_len: list[int], completion_len: list[int], size: int, budget: int) -> list[list[int]]:
    """``hardware.micro_batch_tokens``: the rows of each micro-batch (indices into the step's rows). Rows are sorted by
    total length, longest first (stable), and cut greedily so that a micro-batch holds at most ``size`` rows and its
    padded tokens, rows x (longest prompt + longest completion in it), stay within ``budget`` (a row longer than the
    budget goes alone). Each micro-batch is then trimmed to its own longest row (``TrainBatch.trimmed``)."""
    order = sorted(range(len(prompt_len)), key=lambda i: -(prompt_len[i] + completion_len[i]))
    cuts: list[list[int]] = []
    cur, p_max, c_max = [], 0, 0
    for i in order:
        p, c = max(p_max, prompt_len[i]), max(c_max, completion_len[i])
        if cur and (len(cur) >= size or (len(cur) + 1) * (p + max(c, 1)) > budget):
            cuts.append(cur)
            cur, p, c = [], prompt_len[i], completion_len[i]
        cur.append(i)
        p_max, c_max = p, c
    return cuts + [cur] if cur else cuts


def split_to(cuts: list[list[int]], count: int, cost) -> list[list[int]]:
    """``cuts`` split until there are ``count`` micro-batches (every rank must run as many forwards: ZeRO-3): the
    costliest one of at least 2 rows (``cost(rows)``: its padded tokens) is halved, again and again; stops early when
    every micro-batch is a single row."""
    cuts = [list(c) for c in cuts]
    while len(cuts) < count:
        big = max((c for c in cuts if len(c) > 1), key=cost, default=None)
        if big is None:
            break
        at = cuts.index(big)
        cuts[at : at + 1] = [big[: len(big) // 2], big[len(big) // 2 :]]
    return cuts


def token_budget_rows(rows: int, tokens: int, budget: int | None) -> int | float:
    """The rows of a micro-batch of ``rows`` sequences of ``tokens`` tokens under ``hardware.micro_batch_tokens`` (for
    the memory estimate): at most budget / tokens rows, but never less than one sequence."""
    return rows if not budget else min(float(rows), max(float(budget), float(tokens)) / float(tokens))


def largest_micro_batch(alg, prompts: int, micro_batch_size: int) -> int:
    """The largest micro-batch of the run (its memory peak): the plan at both ends of a ramp."""
    return max(plan(alg, prompts, micro_batch_size, p).micro_batch for p in (0.0, 1.0))
