"""Steps (5b)-(7) of the loop: the prepared rows (``pods.loop.rollouts.Ready``) as a training batch, the token stage
(sampler corrections, token selection: ``pods.tokens``), the policy update and the weight push into the engine; and
the step's metrics row, merged once from what each stage measured (``step_row``).

Each row's staleness is the trainer's policy version before the update minus the row's own version (0 in the
synchronous loop); rows over ``train.max_staleness`` leave the loss (none do, by the producer's schedule).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from pods import tokens
from pods.backends import build_batch
from pods.backends.base import Backend
from pods.distributed import Dist
from pods.engines import Engine
from pods.loop.rollouts import Produced, Ready
from pods.schema import Root


@dataclass(frozen=True)
class Trainer:
    """What steps (5b)-(7) work with: the config, the backend that updates, the pad token of a batch, the trainer's
    ranks, and the engine to push the new weights into (None: the producer pushes, ``pods.loop.producer``)."""

    cfg: Root
    backend: Backend
    pad_id: int
    dist: Dist
    engine: Engine | None = None


@dataclass
class Learned:
    """What steps (5b)-(7) measured: seconds, counts, staleness, and the plug-ins' own metrics as they report them."""

    t_update: float
    t_sync: float
    kept: int  # rows trained
    tokens_trained: int  # completion tokens in the loss
    staleness_max: int
    staleness_mean: float
    update: dict = field(default_factory=dict)  # the backend's (optimizer steps, loss, grad norm, ...)
    token_stage: dict = field(default_factory=dict)  # the token stage's (corrections, selection)


def learn(t: Trainer, ready: Ready, lr, progress: float, version: int | None = None) -> Learned:
    """Steps (5b)-(7) on a prepared batch. ``lr``: the LR of each optimizer step (``pods.plan.step_lr``);
    ``progress``: the training progress in [0, 1]; ``version``: the trainer's policy version before this update
    (the asynchronous loop), None: the synchronous loop (staleness 0)."""
    cfg, a, rows = t.cfg, t.cfg.algorithm, ready.rows
    stale = [0 if version is None else version - v for v in rows.version]
    t0 = time.perf_counter()
    if len(rows):
        batch = build_batch(rows.prompt, rows.completion, rows.logprobs, rows.adv, t.pad_id, groups=rows.group)
        batch.staleness = torch.tensor(stale, dtype=torch.long)
        if cfg.train.old_logprobs == "sampler":
            batch.old_logprobs = batch.sampler_logprobs
        if a.mask_truncated:  # DAPO's overlong filtering: a row cut at sampling.max_tokens leaves the loss
            batch.loss_mask[torch.tensor(rows.truncated, dtype=torch.bool)] = 0.0
        batch.loss_mask[batch.staleness > cfg.train.max_staleness] = 0.0  # admission (none, by the producer's schedule)
        token_stage = tokens.apply(batch, t.backend, a, progress, t.dist)  # (5b) corrections, token selection
        update = t.backend.update(batch, lr, micro_batch_size=ready.micro_batch if a.grad_accum else None)  # (6)
        kept, trained = len(batch), int(batch.loss_mask.sum())
    else:  # every group filtered out on some rank (group_filter): no rank trains this step
        token_stage, update, kept, trained = {}, {"optimizer_steps": 0}, 0, 0
    t1 = time.perf_counter()
    if t.engine is not None and t.engine.needs_sync and len(rows):
        t.engine.load_weights(t.backend.export_weights())  # (7)
    mean = sum(stale) / len(stale) if stale else 0.0
    return Learned(t1 - t0, time.perf_counter() - t1, kept, trained, max(stale, default=0), mean, update, token_stage)


def step_row(p: Produced, u: Learned, t_wait: float | None = None) -> dict:
    """The step's metrics row, from what (2)-(5) and (5b)-(7) measured (``t_wait``: the seconds the trainer waited for
    the producer, asynchronous loop only)."""
    spent = {"t_generate": p.t_generate, "t_score": p.t_score, "t_select": p.t_select, "t_update": u.t_update, "t_sync": u.t_sync}
    counts = {"kept": u.kept, "tokens": p.tokens, "tokens_trained": u.tokens_trained, "truncated": p.truncated}
    staleness = {"staleness_max": u.staleness_max, "staleness_mean": u.staleness_mean}
    waited = {} if t_wait is None else {"t_wait": t_wait}
    return {**u.update, **spent, **p.rewards, **counts, **p.engine, **u.token_stage, **p.refill, **staleness, **waited}
