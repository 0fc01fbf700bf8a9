"""D3S: dynamic dual-level down-sampling (Wang et al., "Learning More with Less", arXiv 2509.22115).

Three registered pieces, all chosen by name in the algorithm section; GRPO, PODS and D3S stay one loop:

- Sample level (``pods.downsample.RULES``), on advantages normalised over the FULL group of n
  (``algorithm.advantage_scope: group``), never re-normalised after selection:
  ``d3s_intra`` keeps, per prompt group, the m rollouts whose advantages have the largest variance;
  ``d3s_cross`` keeps, over all G groups of the step (this rank's), the G * m rollouts whose advantages have
  the largest variance, so a group can give any number 0..n; ``d3s_cross_step`` does the same over every rank's
  groups (the paper's batch is the whole step: exact, gathered, and each rank then trains an equal share);
  ``d3s_two_stage`` reads "a further cross-group selection" as intra-group first (``algorithm.m_intra`` per
  group), then cross-group over the union, also over every rank.
- Token level (``pods.tokens.TOKEN_SELECTORS``): ``d3s_top_k`` keeps the top K fraction of the step's
  completion tokens by ``|A_i| * H_i,t`` (H = the policy's entropy over the vocabulary), over every
  micro-batch and every rank, and drops the rest from the loss (``batch.loss_mask``).
- Schedule: (N, K) move from ``(m, token_keep)`` at progress 0 to ``(m_final, token_keep_final)`` at
  progress 1 along the ramp ``algorithm.ramp`` (``pods.schedules.RAMPS``, linear by default).

What a piece needs of the loop (a gather over ranks, an algorithm key, the entropy pre-pass) is its spec, registered
with its name where the registry lives (``RuleSpec`` in pods.downsample, ``TokenSpec`` in pods.tokens), so it is
known without importing this module.

Why the sample rules are exact: for a multiset x and a size m, some subset of maximal population variance
consists of the k largest and the m - k smallest values for some k (swapping a kept middle value for an
unkept value farther from the kept mean never lowers the variance; the PODS lemma, arXiv 2504.13818). So the
max-Var(A) subset of a group IS "the N_pos most positive + N_neg most negative advantages" with
N_pos + N_neg = m chosen by that k; ``pods.downsample.max_variance`` scores all m + 1 splits exactly. Cross-group
is the same lemma on the step's G * n advantages flattened into one row.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pods.downsample import max_variance
from pods.schedules import ramped
from pods.schema import Algorithm


def token_fraction(alg: Algorithm, progress: float) -> float:
    """K(p): fraction of the step's completion tokens kept, ``token_keep`` -> ``token_keep_final``."""
    return ramped(alg.token_keep, alg.token_keep_final, progress, alg.ramp)


# ---- sample level -------------------------------------------------------------------------------------------
def intra_group(advantages: Tensor, m: int, *, generator: torch.Generator | None = None) -> Tensor:
    """D3S-I: per group, the m rollouts whose advantages have the largest variance (exact).

    Args:
        advantages: ``[G, n]`` advantages normalised over each full group of n.
        m: rollouts kept per group, ``1 <= m <= n``.
        generator: unused (deterministic).
    Returns:
        ``LongTensor[G, m]``, kept column indices ascending per row.

    The optimum is "the N_pos largest + the N_neg smallest" advantages with N_pos + N_neg = m (module
    docstring); ties as ``pods.downsample.max_variance`` (the largest N_pos among equally good splits).
    Since A = (r - mean) / (std + eps) is an increasing affine map of r within a group (or constant 0), the
    kept SET equals PODS' max-variance set on rewards; what differs is that D3S keeps the full-group A.
    """
    return max_variance(advantages, m)


def cross_group(advantages: Tensor, m: int, *, generator: torch.Generator | None = None) -> Tensor:
    """D3S-C: over all G groups of the step, the G * m rollouts whose advantages have the largest variance.

    Args:
        advantages: ``[G, n]`` advantages normalised over each full group (no re-normalisation after).
        m: rollouts kept per group ON AVERAGE, ``1 <= m <= n``; G * m are kept in all.
        generator: unused (deterministic).
    Returns:
        ``LongTensor[G * m]``: flat row indices ``g * n + j`` into the step's G * n rollouts, ascending.

    Exact: ``max_variance`` on the advantages flattened into one row of G * n (same lemma). Zero-variance
    groups (all A = 0) sit in the middle of the sorted row, so they are kept only when fewer than G * m
    rollouts have a non-zero advantage. Ties as ``max_variance`` on the flattened row (row-major order).
    """
    G, n = advantages.shape
    return max_variance(advantages.reshape(1, G * n), G * m)[0]


def cross_step(advantages: Tensor, m: int, *, generator: torch.Generator | None = None) -> Tensor:
    """D3S-C over the whole step of every rank: ``cross_group`` on all W ranks' groups at once (the paper's batch).

    Args:
        advantages: ``[W * G, n]``: every rank's full-group advantages in rank order (``pods.downsample.kept_rows``
            gathers them; on one process W = 1 and this is ``cross_group``).
        m: rollouts kept per group on average; W * G * m are kept in all.
        generator: unused (deterministic).
    Returns:
        ``LongTensor[W * G * m]``: flat row indices into the W * G * n rows, ascending. Every rank computes the same
        selection; rank r trains the r-th of W equal slices of it (``pods.loop.rollouts.Rows.take`` moves those rows
        to it), so every rank still trains G * m rows (lockstep forwards under ZeRO-3, the same normalisers).
    """
    return cross_group(advantages, m)


def two_stage(advantages: Tensor, m: int, *, generator: torch.Generator | None = None, m_intra: int | None = None) -> Tensor:
    """D3S-C read as two stages: per group the ``m_intra`` rollouts of maximal Var(A) (D3S-I), then over the union of
    those G * m_intra rollouts the G * m of maximal Var(A) (exact at each stage, by the lemma of the module docstring).

    Args:
        advantages: ``[W * G, n]`` every rank's full-group advantages (gathered, as ``cross_step``).
        m: rollouts kept per group on average in the end, ``m <= m_intra``.
        generator: unused (deterministic).
        m_intra: rollouts per group kept by the first stage (``algorithm.m_intra``); None = n, which makes the first
            stage keep everything and the rule equal to ``cross_step``.
    Returns:
        ``LongTensor[W * G * m]``: flat row indices, ascending (rank r trains the r-th slice, as ``cross_step``).

    The result is in general not the one-stage optimum: a rollout the first stage drops cannot come back.
    """
    G, n = advantages.shape
    first = max_variance(advantages, n if m_intra is None else m_intra)  # [G, m_intra], ascending per row
    union = (first + n * torch.arange(G, device=advantages.device).unsqueeze(1)).flatten()  # [G * m_intra], ascending
    return union[max_variance(advantages.flatten()[union].unsqueeze(0), G * m)[0]]


# ---- token level --------------------------------------------------------------------------------------------
def global_top(scores: Tensor, fraction: float, dist) -> Tensor:
    """Which of this rank's ``scores: [L]`` are among the top ``ceil(fraction * total)`` of all ranks' scores.

    Every rank gathers every rank's scores (padded to the longest, in rank order), so the threshold is that
    of the step's whole batch and every rank computes the same selection. Ties: a stable descending sort of
    the scores in (rank, row, column) order, so among equal scores the earlier token is kept; on one process
    this is the row-major order of the batch. Returns ``BoolTensor[L]``.
    """
    local = scores.detach().double().flatten().cpu()
    counts = dist.all_gather(torch.tensor([local.numel()], dtype=torch.long))  # [W]
    width, total = int(counts.max()), int(counts.sum())
    if total == 0:  # no live token on any rank (e.g. a correction vetoed every sequence): nothing to keep
        return torch.zeros(0, dtype=torch.bool)
    padded = torch.full((width,), -math.inf, dtype=torch.float64)
    padded[: local.numel()] = local
    every = dist.all_gather(padded).view(-1, width)  # [W, width]
    valid = torch.cat([every[r, : int(c)] for r, c in enumerate(counts)])  # [total]
    k = min(total, math.ceil(fraction * total - 1e-9)) if total else 0
    order = torch.sort(valid, descending=True, stable=True).indices
    keep = torch.zeros(total, dtype=torch.bool)
    keep[order[:k]] = True
    start = int(counts[: dist.rank].sum())
    return keep[start : start + local.numel()]


def top_k_tokens(batch, ctx) -> dict:
    """Keep the top K(p) of the step's loss tokens by ``|A_i,t| * H_i,t``; the others leave the loss.

    ``batch.advantages: [B]`` (one per sequence: A_i,t = A_i), ``ctx.stats.entropy: [B, C]`` (the pre-pass,
    no grad), ``batch.loss_mask: [B, C]`` multiplied in place by the kept-token mask. K is a fraction of the
    tokens still in the loss over the step (all micro-batches, all ranks). Returns the step's metrics (the
    same on every rank): ``token_keep`` (K), ``tokens_kept_frac``, ``entropy_kept``, ``entropy_dropped``.
    """
    K = token_fraction(ctx.alg, ctx.progress)
    live = batch.loss_mask > 0  # [B, C]
    ent = ctx.stats.entropy.to(batch.loss_mask.device)
    score = batch.advantages.abs().unsqueeze(1) * ent  # [B, C]
    kept = torch.zeros_like(live)
    kept[live] = global_top(score[live], K, ctx.dist).to(live.device)
    batch.loss_mask.mul_(kept.to(batch.loss_mask.dtype))
    dropped = live & ~kept
    s_kept, n_kept, s_drop, n_drop = ctx.dist.reduce(
        [float(ent[kept].sum()), float(kept.sum()), float(ent[dropped].sum()), float(dropped.sum())]
    )
    return {
        "token_keep": K,
        "tokens_kept_frac": n_kept / max(n_kept + n_drop, 1),
        "entropy_kept": s_kept / max(n_kept, 1),
        "entropy_dropped": s_drop / max(n_drop, 1),
    }


# ---- logging ------------------------------------------------------------------------------------------------
def strata(prompts: list[list[int]], rewards: Tensor, kept_groups: list[int], rank: int = 0) -> dict[str, list[int]]:
    """Per prompt length in tokens (on toy_sum the length fixes the term count, the difficulty): this rank's
    ``[groups, zero-variance groups, kept rollouts, summed reward of all rollouts]`` (``train.log_strata``; under a
    binary reward the last is the number of correct rollouts).

    Args:
        prompts: this rank's G prompts (token ids).
        rewards: ``[G, n]`` their rollouts' rewards.
        kept_groups: the global group index ``rank * G + g`` of every rollout this rank trains (a whole-step rule can
            move rows across ranks: those of other ranks' groups are not counted here; on one process all are).
        rank: this rank.
    """
    G, out = len(prompts), {}
    for g, p in enumerate(prompts):
        row = out.setdefault(str(len(p)), [0, 0, 0, 0.0])
        row[0] += 1
        row[1] += int(bool((rewards[g] == rewards[g][0]).all()))
        row[3] += float(rewards[g].sum())
    for g in kept_groups:
        if 0 <= g - rank * G < G:
            out[str(len(prompts[g - rank * G]))][2] += 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))
