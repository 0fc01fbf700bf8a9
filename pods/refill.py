"""Steps (2)-(3) of the loop, and dynamic sampling: generate and score prompt groups, drop those whose rewards do not
vary, and refill the step from further prompt batches (DAPO, Yu et al., arXiv 2503.14476, section 3.2; docs/knobs.md).

``generate_groups`` generates n rollouts per prompt and scores them (with the soft overlong penalty, when set, as a
reward term of its own). ``fill_step`` applies ``train.group_filter``:

- ``none`` (the default): the first batch is the step, as before;
- ``nonzero_std``: a group whose n rewards are all equal (every answer right, or every one wrong) has zero advantage
  under a group-normalised estimator and is dropped before down-sampling. While a rank has fewer kept groups than
  ``train.prompts_per_step`` and fewer than ``train.refill_batches`` extra batches were generated, every rank
  generates one more batch of ``prompts_per_step`` prompts from the prompt sampler (every rank: the sampler walks one
  global order, and a ZeRO-3 engine generates in lockstep). Each rank then keeps its first kept groups, as many as
  the rank with the fewest has (at most ``prompts_per_step``), so that every rank trains as many rows in as many
  micro-batches. Extra kept groups are discarded, as DAPO does. A step left with no group trains nothing.

Refill generation happens inside the step, so it counts on the training clock (the x-axis of DAPO's curves), and the
prompt sampler's position and the RNG states, which the checkpoint holds, are all it changes: a resumed run continues
exactly. Logged: ``gen_batches`` (prompt batches generated this step), ``groups_filtered`` (groups dropped, over all
ranks) and ``groups_refilled`` (trained groups that came from refill batches, over all ranks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pods.engines import Sampling
from pods.schema import Root
from pods.tasks import score_batch
from pods.tasks.base import overlong_penalty


@dataclass
class Groups:
    """G prompt groups of n scored rollouts each (row r of the rollouts belongs to group r // n)."""

    n: int
    prompts: list[list[int]]  # [G] prompt ids
    golds: list[str]  # [G]
    completions: list[list[int]]  # [G * n] completion ids
    logprobs: list[list[float]]  # [G * n] the sampler's log-probs
    finish: list[str]  # [G * n] "stop" | "length"
    scores: list  # [G * n] pods.tasks.base.Score
    tokens: int = 0  # completion tokens generated
    metrics: dict = field(default_factory=dict)  # the engine's metrics (of the step's first batch)
    seconds: dict = field(default_factory=dict)  # t_generate, t_score: this batch's (joined: summed)
    versions: list[int] | None = None  # [G * n] the oldest policy version among each rollout's tokens

    @property
    def rewards(self) -> torch.Tensor:
        """[G, n] float64."""
        return torch.tensor([sc.reward for sc in self.scores], dtype=torch.float64).view(len(self.prompts), self.n)

    def take(self, groups: list[int]) -> Groups:
        """The groups ``groups``, in that order."""
        rows = [g * self.n + j for g in groups for j in range(self.n)]
        pick = lambda xs: [xs[r] for r in rows]  # noqa: E731
        return Groups(
            self.n,
            [self.prompts[g] for g in groups],
            [self.golds[g] for g in groups],
            pick(self.completions),
            pick(self.logprobs),
            pick(self.finish),
            pick(self.scores),
            sum(len(c) for c in pick(self.completions)),
            self.metrics,
            self.seconds,
            pick(self.versions) if self.versions is not None else None,
        )

    @staticmethod
    def join(parts: list[Groups]) -> Groups:
        first = parts[0]
        cat = lambda name: [x for p in parts for x in getattr(p, name)]  # noqa: E731
        fields_ = ("prompts", "golds", "completions", "logprobs", "finish", "scores")
        seconds = {k: sum(p.seconds.get(k, 0.0) for p in parts) for k in first.seconds}
        versions = cat("versions") if all(p.versions is not None for p in parts) else None
        return Groups(first.n, *(cat(f) for f in fields_), sum(p.tokens for p in parts), first.metrics, seconds, versions)


def generate_groups(cfg: Root, engine, prompts: list[list[int]], golds: list[str]) -> Groups:
    """(2) n rollouts per prompt, (3) their scores; ``algorithm.overlong_buffer`` adds the reward term ``overlong``."""
    a, s, ds, n = cfg.algorithm, cfg.sampling, cfg.dataset, cfg.algorithm.n
    t0, version = time.perf_counter(), engine.version  # the version it serves as the batch is submitted
    ro = engine.generate(prompts, n, Sampling.draw(s))
    t1 = time.perf_counter()
    scores = score_batch(ro.texts, [g for g in golds for _ in range(n)], ds.recipe, ds.grader, timeout_s=ds.grade_timeout_s)
    if a.overlong_buffer is not None:
        for sc, c in zip(scores, ro.completion_ids):
            sc.terms = {**sc.terms, "overlong": overlong_penalty(len(c), s.max_tokens, a.overlong_buffer, a.overlong_penalty)}
    seconds = {"t_generate": t1 - t0, "t_score": time.perf_counter() - t1}
    versions = list(ro.versions) if ro.versions is not None else [version] * len(ro.completion_ids)
    return Groups(
        n,
        list(prompts),
        list(golds),
        ro.completion_ids,
        ro.logprobs,
        ro.finish_reasons,
        scores,
        ro.num_tokens,
        ro.metrics,
        seconds,
        versions,
    )


def varied(groups: Groups) -> list[int]:
    """The groups whose rewards are not all equal (``nonzero_std``), in order."""
    r = groups.rewards
    return (r.amax(dim=1) > r.amin(dim=1)).nonzero().flatten().tolist()


def fill_step(cfg: Root, engine, first: Groups, more: Callable[[], tuple[list, list]], dist) -> tuple[Groups, Groups, dict]:
    """``train.group_filter`` and ``train.refill_batches`` (module docstring). ``first``: the step's first batch;
    ``more()``: the next batch's (prompts, golds). Returns (the groups this rank trains, every group generated this
    step, the metrics)."""
    t = cfg.train
    if t.group_filter == "none":
        return first, first, {}
    want, batches = len(first.prompts), [first]
    kept = varied(first)
    while len(batches) - 1 < t.refill_batches and dist.any(len(kept) < want):  # the same rounds on every rank
        batches.append(generate_groups(cfg, engine, *more()))
        kept = varied(Groups.join(batches))
    every = Groups.join(batches)
    agreed = int(-dist.reduce([-float(min(len(kept), want))], "max")[0])  # the fewest kept groups over ranks
    kept = kept[:agreed]
    filtered, refilled = dist.reduce([float(len(every.prompts) - len(varied(every))), float(sum(g >= want for g in kept))])
    metrics = {"gen_batches": len(batches), "groups_filtered": int(filtered), "groups_refilled": int(refilled)}
    return every.take(kept), every, metrics
