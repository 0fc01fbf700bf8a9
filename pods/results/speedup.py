"""The speed-up metrics: the band metric (one seed cannot flip it) and the paper's time to 99% of the baseline's peak.

**Band metric** (``band_speedup``; fixed before any run by a ``Band``: the demo's, ``reproduce-figure-*``'s).
Each curve (accuracy against seconds or steps, one seed) is first made monotone by an isotonic fit (pool adjacent
violators over its evaluations), so a noisy dip or spike does not move a crossing. The curves of one arm are then
averaged on a grid from 0 to the end of its shortest seed (every grid point averages every seed; a mean of monotone
curves is monotone). The band's levels are ``band.levels`` accuracies evenly spaced from ``lo`` to ``hi`` of the way
from the baseline's start (its mean fit at x = 0) to its level (the mean fit's top). At each level y,
``t_baseline(y) / t_arm(y)`` (first crossings, linearly interpolated between grid points); the speed-up is the
median over the levels (a level the arm never reaches counts 0, one the baseline never reaches is left out).
Per seed pair (baseline seed k against arm seed k, in seed order) and pooled (the mean curves of all seeds), with
a percentile-bootstrap interval over seeds (each arm resampled with replacement) only from 3 seeds per arm.

**Paper metric** (``pods.results.curves.speedup``): time to 99% of the baseline's best mean; ``budget_bound``
says when the baseline's best point is its last evaluation (it has not plateaued: its time to peak is its budget).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pods.results.curves import GRID, Curve

MIN_SEEDS_FOR_INTERVAL = 3


@dataclass(frozen=True)
class Band:
    """The accuracy levels of the band metric: ``levels`` points from ``lo`` to ``hi`` of the way from the
    baseline's start to its level (fractions in [0, 1], lo < hi)."""

    lo: float = 0.4
    hi: float = 0.9
    levels: int = 11

    def __post_init__(self):
        if not (0.0 <= self.lo < self.hi <= 1.0 and self.levels >= 2):
            raise ValueError(f"a band needs 0 <= lo < hi <= 1 and levels >= 2, got lo={self.lo} hi={self.hi} levels={self.levels}")

    def ys(self, start: float, top: float) -> np.ndarray:
        """[levels] the accuracies of the band between ``start`` and ``top``."""
        return start + np.linspace(self.lo, self.hi, self.levels) * (top - start)

    def text(self) -> str:
        return f"{100 * self.lo:.0f}-{100 * self.hi:.0f}% of the way from start to the baseline's level, {self.levels} levels"


BAND = Band()  # the demo's and the figures' band (docs/cpu-miniature.md: registered before the runs)


def isotonic(ys: np.ndarray) -> np.ndarray:
    """[K] the non-decreasing least-squares fit of ``ys`` [K] (pool adjacent violators, equal weights)."""
    vals, counts = [], []
    for y in np.asarray(ys, dtype=float):
        vals.append(y)
        counts.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:  # a violation: merge the last two blocks into their mean
            c = counts[-2] + counts[-1]
            vals[-2:] = [(vals[-2] * counts[-2] + vals[-1] * counts[-1]) / c]
            counts[-2:] = [c]
    return np.repeat(vals, counts)


def monotone(curve: Curve) -> Curve:
    """(xs [K], isotonic fit of ys [K])."""
    xs, ys = curve
    return np.asarray(xs, dtype=float), isotonic(ys)


def mean_fit(curves: list[Curve], fitted: bool = False) -> Curve:
    """(grid [GRID + 1], the mean of the curves' isotonic fits) from 0 to the shortest curve's end (``fitted``: the
    curves are fits already)."""
    end = min(float(xs[-1]) for xs, _ in curves)
    grid = np.linspace(0.0, end, GRID + 1)
    return grid, np.mean([np.interp(grid, *(c if fitted else monotone(c))) for c in curves], axis=0)


def crossing(curve: Curve, y: float) -> float | None:
    """The first x where the non-decreasing ``curve`` reaches ``y``, interpolated linearly; None if it never does."""
    xs, ys = curve
    hit = np.nonzero(ys >= y - 1e-12)[0]
    if not hit.size:
        return None
    k = int(hit[0])
    if k == 0 or ys[k] == ys[k - 1]:
        return float(xs[k])
    return float(xs[k - 1] + (y - ys[k - 1]) * (xs[k] - xs[k - 1]) / (ys[k] - ys[k - 1]))


def band_point(base: list[Curve], arm: list[Curve], band: Band = BAND, fitted: bool = False) -> dict:
    """The band speed-up of ``arm`` over ``base`` (per-seed curves; their mean fits): the median over levels of
    ``t_base(y) / t_arm(y)``, the levels, both times per level, and how many levels the arm never reached."""
    b, a = mean_fit(base, fitted), mean_fit(arm, fitted)
    ys = band.ys(float(b[1][0]), float(b[1][-1]))
    ratios, t_base, t_arm = [], [], []
    for y in ys:
        tb, ta = crossing(b, y), crossing(a, y)
        t_base.append(tb)
        t_arm.append(ta)
        if tb is not None:
            ratios.append(0.0 if ta is None else (1.0 if ta == tb else tb / ta if ta > 0 else float("inf")))
    never = sum(t is None for t, tb in zip(t_arm, t_base) if tb is not None)
    value = float(np.median(ratios)) if ratios else float("nan")
    return {"speedup": value, "levels": ys, "t_base": t_base, "t_arm": t_arm, "never": never, "top": float(b[1][-1])}


def band_speedup(base: list[Curve], arm: list[Curve], band: Band = BAND, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Pooled band speed-up over all seeds, per seed pair, and (from ``MIN_SEEDS_FOR_INTERVAL`` seeds per arm) the
    percentile-bootstrap interval over seeds: ``speedup``, ``pairs`` [min(len(base), len(arm))], ``lo``/``hi``
    (None below 3 seeds), and the pooled point's levels and times."""
    base, arm = [monotone(c) for c in base], [monotone(c) for c in arm]  # fitted once, resampled below
    out = band_point(base, arm, band, fitted=True)
    out["pairs"] = [band_point([b], [a], band, fitted=True)["speedup"] for b, a in zip(base, arm)]
    out["lo"] = out["hi"] = None
    if min(len(base), len(arm)) >= MIN_SEEDS_FOR_INTERVAL:
        rng = np.random.default_rng(seed)
        boot = [
            band_point(
                [base[i] for i in rng.integers(0, len(base), len(base))], [arm[i] for i in rng.integers(0, len(arm), len(arm))], band, True
            )["speedup"]
            for _ in range(n_boot)
        ]
        q = (1 - level) / 2
        out["lo"], out["hi"] = float(np.nanquantile(boot, q)), float(np.nanquantile(boot, 1 - q))
    return out


def budget_bound(base: list[Curve]) -> int:
    """How many of the baseline's seeds have their best evaluation at their last one (ties: the first best counts)."""
    return sum(int(np.argmax(ys)) == len(ys) - 1 for _, ys in base if len(ys))


def band_line(
    name: str, x: str, base: list[Curve], arm: list[Curve], band: Band = BAND, n_boot: int = 2000, source: str = "sampled accuracy"
) -> str:
    """One printed line: the band metric per seed pair and pooled (``band ... pooled N.NNx``), its interval from 3
    seeds, and which curve it comes from (``source``)."""
    r = band_speedup(base, arm, band, n_boot)
    head = f"{name} by {x}, band on {source} {r['levels'][0]:.3f}-{r['levels'][-1]:.3f} ({band.text()})"
    if r["never"] == band.levels:  # a ratio of 0.00x would read as a number measured
        return f"{head}: no speed-up: the arm reached none of the {band.levels} levels"
    pairs = " ".join(f"{p:.2f}x" for p in r["pairs"])
    interval = f" [95% {r['lo']:.2f}, {r['hi']:.2f}]" if r["lo"] is not None else " (no interval below 3 seeds)"
    never = f"; never reached {r['never']} of {band.levels} levels" if r["never"] else ""
    return f"{head}: per seed pair {pairs}; pooled {r['speedup']:.2f}x{interval}{never}"


def budget_note(base: list[Curve], baseline: str) -> str:
    """'' or the flag the paper's 99% metric needs when the baseline's best point is its last evaluation (in at least
    half of its seeds): its "time to peak" is then its step budget."""
    k = budget_bound(base)
    return (
        f" [budget-bound: {baseline} has not plateaued (best at its last evaluation in {k} of {len(base)} seeds)]"
        if 2 * k >= len(base)
        else ""
    )
