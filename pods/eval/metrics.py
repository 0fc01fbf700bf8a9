"""Metrics over n samples per problem: avg@n (the papers' "Pass@1"), unbiased pass@k, majority@k.

Input per problem: ``correct`` [n] booleans and ``answers`` [n] comparable answer keys (None = no answer).
- avg@n = mean over problems of c / n (c = correct samples of that problem).
- pass@k = mean over problems of 1 - C(n - c, k) / C(n, k): the probability that a uniformly random k-subset of the
  n samples holds a correct one (unbiased for the pass@k of k fresh samples). Computed as the product
  prod_{i = n - c + 1}^{n} (1 - k / i), which never forms a binomial coefficient (no overflow at n = 1024).
- maj@k = over the FIRST k samples of each problem, the answer given most often (ties: the one seen first; None never
  wins) decides; right when the sample that first gave it was graded right. No answer at all = wrong.
Per benchmark, then macro-averaged over benchmarks (each benchmark weighs the same, whatever its size).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    correct: tuple[bool, ...]  # [n]
    answers: tuple[str | None, ...]  # [n], the normalised extracted answer of each sample

    @property
    def n(self) -> int:
        return len(self.correct)


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k) for one problem with c of n samples right (1 <= k <= n, 0 <= c <= n)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_correct(p: Problem, k: int) -> bool:
    """Whether the majority answer of the first k samples is right (see the module docstring)."""
    votes = Counter(a for a in p.answers[:k] if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    first = next(i for i, a in enumerate(p.answers[:k]) if a is not None and votes[a] == top)
    return bool(p.correct[first])


def benchmark_metrics(problems: Sequence[Problem], ks: Sequence[int]) -> dict:
    """``{"problems", "samples", "avg@n", "pass@k": {k: ...}, "maj@k": {k: ...}}`` for one benchmark.

    Every problem must have the same number of samples n, and every k must be <= n."""
    if not problems:
        raise ValueError("no problems to score")
    n = problems[0].n
    if any(p.n != n for p in problems):
        raise ValueError(f"every problem needs the same number of samples; got {sorted({p.n for p in problems})}")
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"k = {bad} outside 1..{n} (the samples per problem)")
    count = len(problems)
    return {
        "problems": count,
        "samples": n,
        "avg@n": sum(sum(p.correct) / n for p in problems) / count,
        "pass@k": {str(k): sum(pass_at_k(n, sum(p.correct), k) for p in problems) / count for k in ks},
        "maj@k": {str(k): sum(majority_correct(p, k) for p in problems) / count for k in ks},
    }


def macro_average(per_benchmark: dict[str, dict]) -> dict:
    """The unweighted mean over benchmarks of avg@n and of each pass@k / maj@k that every benchmark has."""
    rows = list(per_benchmark.values())
    if not rows:
        return {}
    out: dict = {"benchmarks": len(rows), "avg@n": sum(r["avg@n"] for r in rows) / len(rows)}
    for key in ("pass@k", "maj@k"):
        common = set.intersection(*(set(r[key]) for r in rows))
        out[key] = {k: sum(r[key][k] for r in rows) / len(rows) for k in sorted(common, key=int)}
    return out


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself (32 samples -> 1, 2, 4, 8, 16, 32)."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else [*ks, n]
