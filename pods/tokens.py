"""Token-level stage between the advantages and the update: corrections, then token selectors, by name.

A correction (``algorithm.correction``) re-weights or masks tokens because the sampler was not the dense
policy (Sparse-RL); a token selector (``algorithm.token_rule``) keeps a subset of the completion tokens
(D3S). Both edit ``batch.loss_mask`` ([B, C], 1 = the token enters the loss) and ``batch.token_weights``
([B, C] or None = all ones; ``batch.weight_norm_mask`` to have the update normalise them per micro-batch) in
place and return metrics for the step's row. The loss normalisers are taken from ``batch.loss_mask`` after this
stage, over each optimizer step's rows (all micro-batches, all ranks). A step with no token left keeps nothing and
trains nothing (no optimizer step).

A function says what it reads by attributes: ``needs_stats = True`` makes the loop run the no-grad
pre-pass ``backend.policy_stats`` (dense current-policy log-probs, which also become ``batch.old_logprobs``),
``needs_entropy = True`` adds the entropies to it. Neither is run when no function asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pods.registry import Registry
from pods.schema import Algorithm

TOKEN_SELECTORS = Registry("token selector")
CORRECTIONS = Registry("sampler correction")
CORRECTIONS.register_lazy("sparse_rl", "pods.sparse_rl:sparse_rl")  # Sparse-RL: rejection + importance reweighting


@dataclass
class StepContext:
    """What a token-level function may read besides the batch."""

    alg: Any  # the algorithm section (pods.schema.Algorithm)
    progress: float  # training progress p in [0, 1] (the LR schedule's)
    dist: Any  # pods.distributed handle: all_gather / sums over ranks (one process: no-ops)
    stats: Any = None  # pods.backends.TokenStats of the batch, or None


@TOKEN_SELECTORS.register("all")
def keep_all_tokens(batch, ctx: StepContext) -> dict:
    """Every completion token enters the loss (GRPO, PODS)."""
    return {}


TOKEN_SELECTORS.register_lazy("d3s_top_k", "pods.d3s:top_k_tokens")  # D3S: top K% of tokens by |A| x entropy


@CORRECTIONS.register("none")
def no_correction(batch, ctx: StepContext) -> dict:
    """The sampler is taken to be the policy (dense rollouts)."""
    return {}


def apply(batch, backend, alg, progress: float, dist) -> dict:
    """Run the configured correction, then the token selector, on ``batch``; returns their metrics. ``alg``: the
    algorithm section (a plain dict of it is typed)."""
    alg = Algorithm.of(alg)
    corr = CORRECTIONS.get(alg.correction)
    sel = TOKEN_SELECTORS.get(alg.token_rule)
    entropy = any(getattr(f, "needs_entropy", False) for f in (corr, sel))
    stats = None
    if entropy or any(getattr(f, "needs_stats", False) for f in (corr, sel)):
        stats = backend.policy_stats(batch, entropy=entropy)
        if batch.old_logprobs is None:
            batch.old_logprobs = stats.logprobs
    ctx = StepContext(alg=alg, progress=progress, dist=dist, stats=stats)
    return {**corr(batch, ctx), **sel(batch, ctx)}
