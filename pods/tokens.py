"""Token-level stage between the advantages and the update: corrections, then token selectors, by name.

A correction (``algorithm.correction``) re-weights or masks tokens because the sampler was not the dense
policy (Sparse-RL); a token selector (``algorithm.token_rule``) keeps a subset of the completion tokens
(D3S). Both edit ``batch.loss_mask`` ([B, C], 1 = the token enters the loss) and ``batch.token_weights``
([B, C] or None = all ones; ``batch.weight_norm_mask`` to have the update normalise them per micro-batch) in
place and return metrics for the step's row. The loss normalisers are taken from ``batch.loss_mask`` after this
stage, over each optimizer step's rows (all micro-batches, all ranks). A step with no token left keeps nothing and
trains nothing (no optimizer step).

A function says what it reads by the ``TokenSpec`` registered with it: ``needs_stats`` makes the loop run the
no-grad pre-pass ``backend.policy_stats`` (dense current-policy log-probs, which also become ``batch.old_logprobs``),
``needs_entropy`` adds the entropies to it. Neither is run when no function asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pods.registry import Registry
from pods.schema import Algorithm


@dataclass(frozen=True)
class TokenSpec:
    """What a correction or token selector needs (registered with it: ``CORRECTIONS.spec(name)``)."""

    needs_stats: bool = False  # the no-grad pre-pass ``backend.policy_stats`` runs first (``StepContext.stats``)
    needs_entropy: bool = False  # ... with the entropies (implies the pre-pass)
    fraction_keys: tuple[str, ...] = ()  # algorithm keys that must be fractions in (0, 1] (``_final``: or null), by pods.config


TOKEN_SELECTORS = Registry("token selector", spec=TokenSpec)
CORRECTIONS = Registry("sampler correction", spec=TokenSpec)
# Sparse-RL: rejection + importance reweighting
CORRECTIONS.register_lazy("sparse_rl", "pods.sparse_rl:sparse_rl", spec=TokenSpec(needs_stats=True))
# truncated importance weights against the sampler's log-probs (stale or mismatched rollouts)
CORRECTIONS.register_lazy("behaviour_is", "pods.behaviour_is:behaviour_is", spec=TokenSpec(needs_stats=True))


@dataclass
class StepContext:
    """What a token-level function may read besides the batch."""

    alg: Algorithm  # the algorithm section (a plain dict of a whole one is validated here: ConfigError in one line)
    progress: float  # training progress p in [0, 1] (the LR schedule's)
    dist: Any  # pods.distributed handle: all_gather / sums over ranks (one process: no-ops)
    stats: Any = None  # pods.backends.TokenStats of the batch, or None

    def __post_init__(self) -> None:
        self.alg = Algorithm.of(self.alg)  # the public door (docs/api.md): a typed section passes as it is


@TOKEN_SELECTORS.register("all")
def keep_all_tokens(batch, ctx: StepContext) -> dict:
    """Every completion token enters the loss (GRPO, PODS)."""
    return {}


TOKEN_SELECTORS.register_lazy(  # D3S: top K% of tokens by |A| x entropy
    "d3s_top_k", "pods.d3s:top_k_tokens", spec=TokenSpec(needs_entropy=True, fraction_keys=("token_keep", "token_keep_final"))
)


@CORRECTIONS.register("none")
def no_correction(batch, ctx: StepContext) -> dict:
    """The sampler is taken to be the policy (dense rollouts)."""
    return {}


def correction_names(alg: Algorithm) -> tuple[str, ...]:
    """``algorithm.correction`` as the names run in turn (one name, or a list)."""
    return (alg.correction,) if isinstance(alg.correction, str) else tuple(alg.correction)


def staleness_stats(batch, dist) -> dict:
    """Each row's staleness (``batch.staleness`` [B]: policy versions between its oldest token and this update; absent
    or None = 0, the synchronous loop) over the step's rows on every rank: mean and max."""
    s = getattr(batch, "staleness", None)
    values = [] if s is None else [float(x) for x in s.tolist()]
    total, rows = dist.reduce([sum(values), float(len(batch))])
    return {"staleness_mean": total / max(rows, 1.0), "staleness_max": dist.max(max(values, default=0.0))}


def apply(batch, backend, alg: Algorithm, progress: float, dist) -> dict:
    """Run the configured corrections (in turn: each multiplies its weights into ``batch.token_weights``), then the token
    selector, on ``batch``; returns their metrics (the rows' staleness is the loop's: ``pods.loop.learn``). ``alg``: the
    algorithm section."""
    corrs = [CORRECTIONS.get(name) for name in correction_names(alg)]
    sel = TOKEN_SELECTORS.get(alg.token_rule)
    specs = (*(CORRECTIONS.spec(name) for name in correction_names(alg)), TOKEN_SELECTORS.spec(alg.token_rule))
    entropy = any(s.needs_entropy for s in specs)
    stats = None
    if entropy or any(s.needs_stats for s in specs):
        stats = backend.policy_stats(batch, entropy=entropy)
        if batch.old_logprobs is None:
            batch.old_logprobs = stats.logprobs
    ctx = StepContext(alg=alg, progress=progress, dist=dist, stats=stats)
    out: dict = {}
    for corr in corrs:
        out.update(corr(batch, ctx))
    return {**out, **sel(batch, ctx)}
