"""PODS' selection on a trainer's flat batch of rollouts: rows grouped by prompt, n consecutive rows per group (TRL's
layout). Torch only, so a trainer that is not installed here can still be tested against it.

Shapes: B = G * n rows, G prompt groups of n rollouts, m kept per group.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pods.advantages import ADVANTAGES
from pods.downsample import RULES, select
from pods.errors import need

SCALES = ("group", "batch", "none")  # TRL's ``scale_rewards``: std over the group, over the batch, or none
SCOPES = ("kept", "group")  # advantages over the kept rollouts (PODS), or the full group's, not re-normalised (D3S)


def check(n: int, m: int, rule: str, scope: str, scale: str) -> None:
    """``ConfigError`` in one line for a setting the selection cannot run: before any model loads."""
    need(rule in RULES.names(), f"PODS rule '{rule}' is not one of {', '.join(RULES.names())}")
    spec = RULES.spec(rule)
    need(not (spec.cross_group or spec.across_ranks), f"PODS rule '{rule}' picks across groups; here each group keeps m of its n")
    need(isinstance(m, int) and 1 <= m <= n, f"PODS m must be an integer in 1..n = {n} (num_generations), got {m!r}")
    need(rule != "all" or m == n, f"PODS rule 'all' keeps every rollout: m must equal n = {n}, got {m}")
    need(scope in SCOPES, f"PODS advantage_scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    need(scale in SCALES, f"scale_rewards must be one of {', '.join(SCALES)}, got {scale!r}")


def kept_advantages(kept_rewards: Tensor, scale: str) -> Tensor:
    """Advantages of the kept rollouts, normalised over them as the paper does. ``kept_rewards: [G, m] -> [G, m]``.

    ``group``: (r - mean) / (std + 1e-4) per group, unbiased std (``pods.advantages`` ``grpo``, TRL's formula);
    ``none``: r - mean (``mean_centered``); ``batch``: r - the group's mean, over the std of every kept reward + 1e-4."""
    if scale == "group":
        return ADVANTAGES.get("grpo")(kept_rewards)
    centred = ADVANTAGES.get("mean_centered")(kept_rewards)
    if scale == "none":
        return centred
    std = kept_rewards.std() if kept_rewards.numel() > 1 else torch.zeros(())
    return centred / (std + 1e-4)


def keep(
    rewards: Tensor,
    n: int,
    m: int,
    rule: str,
    *,
    scope: str = "kept",
    scale: str = "group",
    group_advantages: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """The rows to train and their advantages. ``rewards: [B]``, ``group_advantages: [B]`` (scope ``group``: what the
    rule reads and what the kept rows keep). Returns ``(rows LongTensor[G * m], advantages [G * m])``, rows ascending.

    Scope ``kept`` (PODS): ``rule`` picks m of each group's n by reward, the advantages are normalised over the kept m.
    Scope ``group`` (D3S's sample level with rule ``d3s_intra``): the rule picks by the full-group advantages and the
    kept rows keep them."""
    need(rewards.dim() == 1 and rewards.numel() % n == 0, f"PODS needs whole groups: {rewards.numel()} rows is not a multiple of n = {n}")
    G = rewards.numel() // n
    if scope == "group":
        need(group_advantages is not None, "PODS advantage_scope 'group' needs the full group's advantages")
        scores = group_advantages.reshape(G, n).to(torch.float32)
        cols = select(rule, scores, m, generator=generator)  # [G, m]
        adv = scores.gather(1, cols)
    else:
        grouped = rewards.reshape(G, n).to(torch.float32)
        cols = select(rule, grouped, m, generator=generator)
        adv = kept_advantages(grouped.gather(1, cols), scale)
    rows = cols + n * torch.arange(G, device=cols.device).unsqueeze(1)  # [G, m] flat row indices
    return rows.flatten(), adv.flatten()


def take(batch: dict[str, Any], rows: Tensor, size: int) -> dict[str, Any]:
    """``batch`` with only ``rows`` of every per-row value (a tensor or list of length ``size``); scalars as they are."""
    idx = rows.tolist()
    out = {}
    for key, value in batch.items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == size:
            out[key] = value[rows.to(value.device)]
        elif isinstance(value, list) and len(value) == size:
            out[key] = [value[i] for i in idx]
        else:
            out[key] = value
    return out
