"""Sparse-RL's correction (``algorithm.correction=sparse_rl``): sparsity-aware rejection + importance reweighting.

The sampler generated with a compressed KV cache (``pi_sparse``); the trainer's dense pre-pass gives the dense
old policy (``pi_old``). Per completion token, r_t = exp(clamp(log pi_old - log pi_sparse, -c, c)):
- rejection: a whole sequence is dropped (loss_mask 0) if any valid token has the UNCLAMPED ratio below
  ``veto`` (1e-4); tokens whose r_t lies outside the trust band [``band_low``, ``band_high``] are masked;
- reweighting: w_t = min(r_t, ``cap``), divided by its mean so that it averages 1, and multiplied into the
  clipped surrogate through ``batch.token_weights`` (the KL term too unless ``algorithm.kl_weighted`` is false).
  The mean is taken over the post-rejection tokens (``weight_norm: valid``) or all valid tokens (``all``), over the
  step's whole batch on every rank (``norm_scope: step``) or, as the release does, per micro-batch on each rank
  (``micro_batch``: the update divides, reading ``batch.weight_norm_mask``); ``none`` leaves w as it is.
The loss normalisers then come from the post-rejection ``loss_mask`` (``Backend.update``). The thresholds' defaults
are the released values; the normaliser's defaults are pods' (the release: ``all``, ``micro_batch``);
docs/sparse-rl.md gives the source of each and the choices.
"""

from __future__ import annotations

import math

import torch

from pods.schema import Algorithm, SparseRl, defaults
from pods.tokens import StepContext

DEFAULTS = defaults(SparseRl)  # the schema's: the released thresholds, pods' normaliser (docs/sparse-rl.md)
WEIGHT_NORMS = ("valid", "all", "none")


def settings(alg: Algorithm) -> SparseRl:
    """The correction's settings: ``algorithm.sparse_rl``."""
    return alg.sparse_rl


def sparse_rl_weights(dense: torch.Tensor, sparse: torch.Tensor, mask: torch.Tensor, c: SparseRl | dict, dist=None):
    """Rejection mask and importance weights of one step's batch.

    dense, sparse: [B, C] log-probs of the sampled tokens under the dense old policy and the sparse sampler;
    mask: [B, C] float, 1 on valid completion tokens. ``dist`` (pods.distributed handle) sums the weight
    normaliser over ranks. Returns (new_mask [B, C], weights [B, C], stats dict of global sums); with
    ``norm_scope: micro_batch`` the weights are returned unnormalised (the update normalises each micro-batch).
    """
    c = SparseRl.of(c)  # the public door (docs/api.md): a plain dict is validated, ConfigError in one line
    valid = mask > 0
    raw = dense - sparse
    r = torch.exp(raw.clamp(-c.log_ratio_clamp, c.log_ratio_clamp))
    vetoed = ((raw < math.log(c.veto)) & valid).any(dim=1)  # [B]
    in_band = (r >= c.band_low) & (r <= c.band_high)
    new_mask = mask * in_band.float() * (~vetoed).float().unsqueeze(1)
    w = r.clamp(max=c.cap) * mask
    norm_mask = {"valid": new_mask, "all": mask}.get(c.weight_norm)
    has_seq = valid.any(dim=1)
    sums = [
        float((w * norm_mask).sum()) if norm_mask is not None else 0.0,
        float(norm_mask.sum()) if norm_mask is not None else 0.0,
        float((vetoed & has_seq).sum()),
        float(has_seq.sum()),
        float((valid & ~in_band).sum()),
        float(valid.sum()),
        float(((sparse - dense) * mask).sum()),
        float(((r - raw.clamp(-c.log_ratio_clamp, c.log_ratio_clamp) - 1) * mask).sum()),
    ]
    if dist is not None:
        sums = dist.reduce(sums)
    if norm_mask is not None and c.norm_scope == "step" and sums[1] > 0 and sums[0] > 1e-8:
        w = w / (sums[0] / sums[1])
    keys = ("w_sum", "w_count", "rejected", "seqs", "out_of_band", "tokens", "kl", "k3")
    return new_mask, w, dict(zip(keys, sums))


def sparse_rl(batch, ctx: StepContext) -> dict:
    """Reject and reweight tokens of a sparse sampler against the dense old policy (edits the batch in place).

    Registered lazily in pods.tokens as CORRECTIONS ``sparse_rl`` with ``TokenSpec(needs_stats=True)``: ``ctx.stats``
    holds the dense pre-pass."""
    c = settings(ctx.alg)
    mask = batch.loss_mask
    new_mask, w, s = sparse_rl_weights(ctx.stats.logprobs.float(), batch.sampler_logprobs.float(), mask, c, ctx.dist)
    batch.loss_mask = new_mask
    batch.token_weights = w if batch.token_weights is None else batch.token_weights * w
    if c.norm_scope == "micro_batch":
        batch.weight_norm_mask = {"valid": new_mask, "all": mask}.get(c.weight_norm)
    kept = w[new_mask > 0]
    w_max = ctx.dist.max(float(kept.max())) if kept.numel() else ctx.dist.max(0.0)
    tokens = max(s["tokens"], 1.0)
    return {
        "sparse_rl_rejected_frac": s["rejected"] / max(s["seqs"], 1.0),
        "sparse_rl_masked_frac": s["out_of_band"] / tokens,
        "sparse_rl_weight_mean": float(kept.mean()) if kept.numel() else 0.0,
        "sparse_rl_weight_max": w_max,
        "mismatch_kl": s["kl"] / tokens,
        "mismatch_k3": s["k3"] / tokens,
    }
