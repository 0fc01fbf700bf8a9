"""Importance weights against the sampler (``algorithm.correction=behaviour_is``), truncated or masked: off-policy rollouts.

A rollout drawn from a behaviour policy mu (the sampler: an older policy version when the producer runs ahead of the
trainer, ``batch.staleness`` > 0, or another numerics, vLLM vs the trainer) is trained with the trainer's policy
before this update, pi_old (the dense pre-pass, which also becomes ``batch.old_logprobs``, so the clipped ratio is
pi_theta / pi_old as in decoupled PPO). Each completion token's loss is multiplied by a weight w of the ratio
  token level:    r_t = exp(log pi_old_t - log mu_t)
  sequence level: r_i = exp(mean_t (log pi_old_t - log mu_t)) on every token of row i (the geometric mean)
with C = ``algorithm.correction_clip`` above and c = ``algorithm.correction_low`` below (0: no lower bound): truncated
(``algorithm.correction_mode=truncate``, the default) w = min(C, max(c, r)); masked (``mask``) w = r inside [c, C] and
0 outside it, so a token (token level) or a whole row (sequence level) whose ratio left the bounds gets no gradient
while the others keep their exact ratio. A masked token stays in the loss's normalisers (a zero weight, as TRL's
``*_mask`` modes; its definition, checked against trl 1.16.0, not its code). The weights are not renormalised (a
biased, bounded-variance estimate).
Truncating a per-token ratio at a constant is IMPALA's V-trace rho (arXiv 1802.01561, rho_bar = 1) and TIS (the
trainer-vs-vLLM correction of Yao et al. 2025, C = 2). The sequence level takes the geometric mean, not the product
of the token ratios: the product's log is a sum over the row's tokens, so its spread grows with the length and a
fixed C clips nearly every long row; the length-normalised mean is how GSPO (arXiv 2507.18071) defines a sequence's
ratio. Composition: corrections run in the order of ``algorithm.correction``; each multiplies its weights into
``batch.token_weights``; ``[sparse_rl, behaviour_is]`` is refused (both weight by pi_old / sampler: Sparse-RL's weights
already correct stale compressed-KV rollouts; docs/async-measured.md). PODS' down-sampling has chosen
the rows before; a token selector (D3S) masks tokens after, on the weighted batch.
"""

from __future__ import annotations

import torch

from pods.tokens import StepContext, staleness_stats


def behaviour_weights(
    old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, level: str, clip: float, low: float = 0.0, mode: str = "truncate"
):
    """Truncated or masked importance weights of one batch.

    old, behaviour: [B, C] log-probs of the sampled tokens under pi_old and the sampler; mask: [B, C] float, 1 on the
    tokens in the loss. Returns (w [B, C], 0 off the mask; outside [B, C] bool, True where the ratio is above ``clip``
    or below ``low``, on the mask only: truncated or zeroed). ``level``: ``token`` or ``sequence`` (the row's geometric
    mean; a row without a token in the loss gets 0); ``mode``: ``truncate`` (clamped to [low, clip]) or ``mask`` (0
    outside [low, clip])."""
    log_r = (old.float() - behaviour.float()) * mask
    if level == "sequence":
        log_r = (log_r.sum(1) / mask.sum(1).clamp(min=1.0)).unsqueeze(1).expand_as(mask)
    ratio = torch.exp(log_r)
    outside = ((ratio > clip) | (ratio < low)) & (mask > 0)
    w = ratio.clamp(min=low, max=clip) if mode == "truncate" else ratio.masked_fill(outside, 0.0)
    return w * mask, outside


def behaviour_is(batch, ctx: StepContext) -> dict:
    """Multiply the weights into ``batch.token_weights`` (in place); the weights' stats over the step's loss tokens on
    every rank (mean, max, the share outside [c, C]: truncated or masked) and the rows' staleness.

    Registered lazily in pods.tokens as CORRECTIONS ``behaviour_is`` with ``TokenSpec(needs_stats=True)``: ``ctx.stats``
    holds the dense pre-pass (pi_old)."""
    a, mask = ctx.alg, batch.loss_mask
    bounds = (a.correction_clip, a.correction_low, a.correction_mode)
    w, truncated = behaviour_weights(ctx.stats.logprobs, batch.sampler_logprobs, mask, a.correction_level, *bounds)
    batch.token_weights = w if batch.token_weights is None else batch.token_weights * w
    live = mask > 0
    w_sum, tokens, n_truncated = ctx.dist.reduce([float(w[live].sum()), float(live.sum()), float(truncated.sum())])
    w_max = ctx.dist.max(float(w[live].max()) if live.any() else 0.0)
    return {
        "bis_weight_mean": w_sum / max(tokens, 1.0),
        "bis_weight_max": w_max,
        "bis_clipped_frac": n_truncated / max(tokens, 1.0),
        **staleness_stats(batch, ctx.dist),
    }
