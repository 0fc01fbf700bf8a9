"""Down-sampling rules: from n scored rollouts per prompt group, keep m (PODS, arXiv 2504.13818).

Every rule has the signature ``rule(rewards, m, *, generator=None) -> kept`` with
``rewards: Tensor[G, n]`` (one row per prompt group) and ``kept: LongTensor[G, m]``, the column
indices of the kept rollouts, sorted ascending within each row, on ``rewards.device``. Rules are
registered by name in ``RULES``; a config names one (``downsample: max_variance``) and the loop
calls ``select(name, rewards, m)``. GRPO is rule ``all`` with m = n.

Shared input policy (``_check``): ``rewards`` must be a real 2-D tensor, ``1 <= m <= n``, and every
entry finite; NaN or +-inf raises ValueError naming the offending group rows (no rule silently
drops or ranks them).

The public names ``random`` and ``all`` shadow the builtins inside this module on purpose, so that
``from pods.downsample import max_variance, max_reward, random, all`` works.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import Tensor

from pods.registry import Registry
from pods.schema import Algorithm


@dataclass(frozen=True)
class RuleSpec:
    """What a rule needs of ``kept_rows`` (registered with it: ``RULES.spec(name)``)."""

    cross_group: bool = False  # the rule returns flat row indices over all groups of the step (``d3s_cross``)
    across_ranks: bool = False  # over every rank's groups: ``kept_rows`` gathers, ``pods.loop.rollouts.Rows.take`` moves the kept rows
    options: tuple[str, ...] = ()  # algorithm keys passed to the rule as keyword arguments (``d3s_two_stage``: m_intra)


RULES = Registry("downsample rule", spec=RuleSpec)

_EPS64 = torch.finfo(torch.float64).eps


def _check(rewards: Tensor, m: int) -> int:
    """Validate ``rewards: [G, n]`` and ``m``; return ``m`` as a Python int."""
    if not isinstance(rewards, Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be 2-D [groups, n], got shape {tuple(rewards.shape)}")
    if rewards.is_complex():
        raise ValueError(f"rewards must be real, got dtype {rewards.dtype}")
    m = operator.index(m)
    n = rewards.shape[1]
    if not 1 <= m <= n:
        raise ValueError(f"m must satisfy 1 <= m <= n; got m={m}, n={n}")
    # A row sum is finite unless the row holds NaN/inf (or overflows): only then scan elements.
    if rewards.is_floating_point() and not bool(torch.isfinite(rewards.sum(dim=1)).all()):
        bad = ~torch.isfinite(rewards).all(dim=1)
        if bool(bad.any()):
            rows = bad.nonzero().flatten().tolist()
            shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
            raise ValueError(
                f"rewards contain NaN or inf in group(s) (row index) {shown}; first bad group {rows[0]}: {rewards[rows[0]].tolist()[:16]}"
            )
    return m


def _as_sortable(rewards: Tensor) -> Tensor:
    """Floating tensors as they are; bool/int rewards as float64 (exact up to 2**53)."""
    return rewards if rewards.is_floating_point() else rewards.to(torch.float64)


def _sorted_rows(idx: Tensor, n: int) -> Tensor:
    """Sort each row of ``idx: [G, m]`` (distinct column indices < n per row) ascending.

    For larger m a boolean ``[G, n]`` mask read back in row-major order (O(G n)) beats the
    O(G m log m) sort.
    """
    G, m = idx.shape
    if m * m.bit_length() <= 3 * n // 2:
        return idx.sort(dim=1).values
    mask = torch.zeros(G, n, dtype=torch.bool, device=idx.device).scatter_(1, idx, True)
    return mask.nonzero()[:, 1].view(G, m)


def _best_k(low: Tensor, top: Tensor) -> Tensor:
    """Best candidate "k highest + (m-k) lowest" per row; ties go to the largest k.

    Args:
        low: ``[G, m]`` the m smallest rewards of each row, ascending.
        top: ``[G, m]`` the m largest rewards of each row, descending.
    Returns:
        ``LongTensor[G, 1]``, k in 0..m.

    float64, shifted by the row minimum: an element of the row, so for nearby values the shifted
    differences are exact (Sterbenz) and 1e6 + 1e-3 * i rewards (float64) keep their spread.
    Candidate k swaps the k largest of the m lowest for the k highest, so its sums are
    ``sum(low) + cumsum(top - low.flip(1))[k-1]`` (same for squares). Objective ``m * S_k(x^2) - S_k(x)^2`` = m^2 * population variance; any
    fixed-m normalisation has the same argmax. Candidates within a rounding bound
    ``4 (m+1) m eps64 * max_k S_k(x^2)`` of the best count as tied.
    """
    G, m = low.shape
    shift = low[:, :1].to(torch.float64)  # [G, 1]; float64 operand: the subtractions run in float64
    lo_r = low.flip(1) - shift  # [G, m] the m lowest, descending, >= 0
    hi = top - shift  # [G, m] the m highest, descending; hi >= lo_r elementwise
    b1, b2 = lo_r.sum(1, keepdim=True), lo_r.square().sum(1, keepdim=True)  # k = 0: the m lowest
    gain = torch.empty(2, G, m, dtype=torch.float64, device=low.device)  # swap gains, x and x^2
    torch.sub(hi, lo_r, out=gain[0])
    torch.mul(gain[0], hi.add_(lo_r), out=gain[1])  # hi^2 - lo_r^2 >= 0
    gain.cumsum_(dim=2)
    s1, s2 = gain[0].add_(b1), gain[1].add_(b2)  # [G, m]: sums for k = 1..m; s2 nondecreasing
    obj = s2.mul(m).sub_(s1.square_())  # [G, m]: k = 1..m
    best = torch.maximum(m * b2 - b1.square(), obj.amax(dim=1, keepdim=True))  # over k = 0..m
    tol = (4 * (m + 1) * m * _EPS64) * s2[:, -1:]  # s2[:, -1] = max_k S_k(x^2)
    ks = torch.arange(1, m + 1, device=low.device)
    return torch.where(obj >= best - tol, ks, 0).amax(dim=1, keepdim=True)  # none tied: k = 0


def _max_variance_sorted(x: Tensor, m: int) -> Tensor:
    """Max-variance selection via one stable sort per row; ``x: [G, n]`` -> ``[G, m]`` ascending.

    The reference path: it realises the documented tie rule directly (see ``max_variance``).
    """
    n = x.shape[1]
    vals, perm = x.sort(dim=1, stable=True)  # [G, n] each
    k = _best_k(vals[:, :m], vals[:, n - m :].flip(1))  # [G, 1]
    j = torch.arange(m, device=x.device)  # kept slot j: low part if j < m-k, else from the top
    return _sorted_rows(perm.gather(1, j + (n - m) * (j >= m - k)), n)


def _keep_by_threshold(x: Tensor, k: Tensor, low: Tensor, top: Tensor) -> Tensor:
    """Kept columns of candidate k under the stable-sort tie rule, without a sort.

    Args:
        x: ``[G, n]`` rewards; k: ``[G, 1]`` chosen candidates;
        low: ``[G, m]`` the m smallest values ascending; top: ``[G, m]`` the m largest descending.
    Returns:
        ``LongTensor[G, m]``, ascending per row: every value below the low threshold
        ``a = low[m-k-1]`` and above the high one ``b = top[k-1]``, plus the first (smallest)
        columns equal to ``a`` and the last (largest) columns equal to ``b`` as needed. This is
        exactly positions ``[0, m-k) + [n-k, n)`` of the stable ascending order. O(G n).
    """
    G, m = low.shape
    lo_n = m - k  # [G, 1] size of the low part
    a = torch.where(lo_n > 0, low.gather(1, (lo_n - 1).clamp(min=0)), -torch.inf)  # [G, 1]
    b = torch.where(k > 0, top.gather(1, (k - 1).clamp(min=0)), torch.inf)
    # a-valued columns the low part takes (values below a all sit in ``low``), likewise for b
    need_a = (lo_n - (low < a).sum(dim=1, keepdim=True)).to(torch.int32)
    need_b = (k - (top > b).sum(dim=1, keepdim=True)).to(torch.int32)
    eq_a, eq_b = x == a, x == b  # [G, n]
    rank_a = eq_a.cumsum(dim=1, dtype=torch.int32)  # 1-based rank among equal values, by column
    rank_b = eq_b.cumsum(dim=1, dtype=torch.int32)
    keep = (x < a) | (x > b) | (eq_a & (rank_a <= need_a))
    keep |= eq_b & (rank_b > rank_b[:, -1:] - need_b)
    return keep.nonzero()[:, 1].view(G, m)


def _max_variance_topk(x: Tensor, m: int) -> Tensor:
    """Max-variance selection from the m+1 smallest and largest values only (needs m < n).

    ``x: [G, n]`` -> ``[G, m]`` ascending, same result as ``_max_variance_sorted``. In a row with
    no tie at a selection boundary (an unselected value equal to the last kept one of the low or
    high part) the kept set is unique and comes straight from the topk indices, whatever order
    topk gives equal values; rows with such a tie go through ``_keep_by_threshold``.
    """
    lo_v, lo_i = x.topk(m + 1, dim=1, largest=False)  # [G, m+1] ascending
    hi_v, hi_i = x.topk(m + 1, dim=1)  # [G, m+1] descending
    low, top = lo_v[:, :m], hi_v[:, :m]
    k = _best_k(low, top)  # [G, 1]
    lo_last = (m - 1 - k).clamp(min=0)  # last kept slot of each part (valid when the part is used)
    hi_last = (k - 1).clamp(min=0)
    lo_tie = (k < m) & (lo_v.gather(1, lo_last) == lo_v.gather(1, lo_last + 1))
    hi_tie = (k > 0) & (hi_v.gather(1, hi_last) == hi_v.gather(1, hi_last + 1))
    tied = (lo_tie | hi_tie).flatten().nonzero().flatten()  # rows whose kept set needs the tie rule
    if tied.numel() == x.shape[0]:
        return _keep_by_threshold(x, k, low, top)
    j = torch.arange(m, device=x.device)  # slot j: lo_i[j] if j < m-k, else hi_i[j - (m-k)]
    both = torch.cat([lo_i[:, :m], hi_i[:, :m]], dim=1)  # [G, 2m]
    kept = _sorted_rows(both.gather(1, j + k * (j >= m - k)), x.shape[1])
    if tied.numel():
        kept[tied] = _keep_by_threshold(x[tied], k[tied], low[tied], top[tied])
    return kept


@RULES.register("max_variance")
def max_variance(rewards: Tensor, m: int, *, generator: torch.Generator | None = None) -> Tensor:
    """Keep the m rollouts per group whose rewards have the largest variance (exact).

    Args:
        rewards: ``[G, n]`` real rewards, one row per prompt group.
        m: rollouts to keep per group, ``1 <= m <= n``.
        generator: unused (deterministic rule); accepted for a uniform signature.
    Returns:
        ``LongTensor[G, m]``: kept column indices, ascending within each row.

    By the PODS lemma some optimum is "the k highest + the (m - k) lowest" of the sorted row for
    some k in 0..m; all m + 1 candidates are scored at once from prefix sums (``_best_k``, float64,
    shifted by an element of the row, so float64 rewards like 1e6 + 1e-3 * i stay exact). The sorted
    values come from one stable sort, or, when m is small next to n (``3 (m+1) <= n``, n >= 32),
    from two ``topk(m + 1)`` calls (same result, cheaper). Batched over G, no Python loop over
    groups; O(G n log n) time, O(G n) memory.

    Tie-breaking (deterministic): candidates whose objective is within a float64 rounding bound
    of the best count as tied and the LARGEST k wins (prefer more high-reward rollouts; e.g.
    binary rewards with odd m keep ceil(m/2) of the higher value). Among equal reward values the
    order is the stable ascending sort (by column index): the low part takes the smallest such
    columns and the high part the largest. So m = 1 keeps the LAST column holding the row
    maximum, and a constant row keeps its last m columns.
    """
    m = _check(rewards, m)
    x = _as_sortable(rewards)
    n = x.shape[1]
    return _max_variance_topk(x, m) if 3 * (m + 1) <= n and n >= 32 else _max_variance_sorted(x, m)


@RULES.register("max_reward")
def max_reward(rewards: Tensor, m: int, *, generator: torch.Generator | None = None) -> Tensor:
    """Keep the m highest-reward rollouts per group.

    Args:
        rewards: ``[G, n]`` real rewards.
        m: rollouts to keep per group, ``1 <= m <= n``.
        generator: unused (deterministic rule).
    Returns:
        ``LongTensor[G, m]``, ascending within each row.

    Ties: a stable descending sort, so among equal rewards the smaller column index is kept.
    """
    m = _check(rewards, m)
    perm = _as_sortable(rewards).sort(dim=1, descending=True, stable=True).indices  # [G, n]
    return _sorted_rows(perm[:, :m], perm.shape[1])


@RULES.register("random")
def random(rewards: Tensor, m: int, *, generator: torch.Generator | None = None) -> Tensor:
    """Keep a uniformly random m-subset per group, ignoring the reward values.

    Args:
        rewards: ``[G, n]`` (only the shape and device are used, after the shared checks).
        m: rollouts to keep per group, ``1 <= m <= n``.
        generator: source of randomness; ``None`` uses torch's global RNG on ``rewards.device``.
    Returns:
        ``LongTensor[G, m]``, ascending within each row.

    Draws G * n uniforms in one ``torch.rand`` call (on the generator's device) and keeps each
    row's m largest keys: rows are independent, and a seeded generator reproduces the selection.
    """
    m = _check(rewards, m)
    device = generator.device if generator is not None else rewards.device
    keys = torch.rand(rewards.shape, generator=generator, device=device)  # [G, n]
    return _sorted_rows(keys.topk(m, dim=1).indices, keys.shape[1]).to(rewards.device)


@RULES.register("all")
def all(rewards: Tensor, m: int, *, generator: torch.Generator | None = None) -> Tensor:
    """Keep every rollout (GRPO). Requires ``m == n``; returns ``arange(n)`` per row, ``[G, n]``."""
    m = _check(rewards, m)
    G, n = rewards.shape
    if m != n:
        raise ValueError(f"rule 'all' keeps every rollout and needs m == n; got m={m}, n={n}")
    return torch.arange(n, device=rewards.device).repeat(G, 1)


def select(rule: str, rewards: Tensor, m: int, *, generator: torch.Generator | None = None) -> Tensor:
    """Apply the registered rule ``rule`` to ``rewards: [G, n]``; returns ``LongTensor[G, m]``.

    Unknown ``rule`` raises ValueError listing the valid names (``RULES.names()``).
    """
    return RULES.get(rule)(rewards, m, generator=generator)


# D3S (arXiv 2509.22115): rules that read advantages normalised on the full group (pods.d3s).
_STEP = RuleSpec(cross_group=True, across_ranks=True)
RULES.register_lazy("d3s_intra", "pods.d3s:intra_group")
RULES.register_lazy("d3s_cross", "pods.d3s:cross_group", spec=RuleSpec(cross_group=True))  # over this rank's groups
RULES.register_lazy("d3s_cross_step", "pods.d3s:cross_step", spec=_STEP)  # over every rank's groups (the whole step)
RULES.register_lazy(  # intra-group, then cross-group over the union (whole step)
    "d3s_two_stage", "pods.d3s:two_stage", spec=RuleSpec(cross_group=True, across_ranks=True, options=("m_intra",))
)


def across_ranks(rule: str) -> bool:
    """Whether ``rule`` selects over every rank's groups at once (``kept_rows`` gathers; ``Rows.take`` moves rows)."""
    return RULES.spec(rule).across_ranks


def kept_rows(rule: str, scores: Tensor, m: int, *, generator: torch.Generator | None = None, dist=None, alg=None) -> Tensor:
    """The kept rollouts as flat row indices ``g * n + j`` into the step's ``scores: [G, n]``, ascending: ``LongTensor[K]``.

    A per-group rule keeps m per group (K = G * m); a rule whose ``RuleSpec`` says ``cross_group`` (``d3s_cross``)
    picks over all G groups at once and returns the flat indices itself (K = G * m, any number per group). One with
    ``across_ranks`` (``d3s_cross_step``) first gathers every rank's ``scores`` (``dist``, rank order), so its
    indices run over the W * G * n rows of the whole step (K = W * G * m, the same on every rank). The spec's
    ``options`` (names of algorithm keys) are read from ``alg``, the algorithm section (a plain dict of a whole one is
    validated: ``ConfigError`` in one line).
    """
    fn, spec = RULES.get(rule), RULES.spec(rule)
    alg = Algorithm.of(alg) if alg is not None else None  # the public door (docs/api.md); a typed section passes as it is
    opts = {k: getattr(alg, k) for k in spec.options} if alg is not None else {}
    if spec.across_ranks and dist is not None:
        scores = dist.all_gather(scores)  # [W * G, n]
    if spec.cross_group:
        return fn(scores, m, generator=generator, **opts)
    G, n = scores.shape
    return (fn(scores, m, generator=generator, **opts) + n * torch.arange(G, device=scores.device).unsqueeze(1)).flatten()
