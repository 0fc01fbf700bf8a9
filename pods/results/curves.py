"""Mean curves over seeds, and the paper's metric: how much sooner an arm reaches 99% of a baseline's best.

A run's curve (accuracy against training seconds or optimizer steps) is linearly interpolated onto a grid and
left out (NaN) outside its own evaluated span: nothing is extrapolated, so each grid point averages the runs
that reach it (``MeanCurve.runs``). Grids:

- ``fine_grid``: ``GRID + 1`` points from 0 to the median of the runs' ends (the furthest x at least half of
  them reach: under a changing machine load, seeds with the same step budget end at different seconds); the
  speed-up is then the crossing time to within 1/``GRID`` of the span.
- ``eval_grid``: 0 to the latest evaluation, spaced by the median gap between consecutive evaluations (the
  figures' tables); ``MeanCurve.covered`` keeps the points that average at least half of the most runs.

The target is ``frac`` (0.99) times the maximum of the baseline's mean curve; the time to target is the first
grid point where a mean curve reaches it; the speed-up is ``t_baseline / t_arm``. Its 95% interval is the
percentile bootstrap over seeds: every resample draws each arm's seeds with replacement (independently),
recomputes both mean curves, the target and the ratio; a resample in which the arm never reaches the target
counts as a speed-up of 0 (reported as ``never``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np

GRID = 400  # fine-grid intervals per span
Curve = tuple[np.ndarray, np.ndarray]  # (xs [K] ascending, ys [K])
CURVE_FIELDS = ["source", "label", "time", "mean", "lo", "hi", "se", "runs"]


def on_grid(curves: list[Curve], grid: np.ndarray) -> np.ndarray:
    """[R, G]: each of the R curves interpolated at the G grid points inside its span, NaN outside it."""
    return np.array([np.where((grid >= xs[0] - 1e-9) & (grid <= xs[-1] + 1e-9), np.interp(grid, xs, ys), np.nan) for xs, ys in curves])


@dataclass
class MeanCurve:
    """The mean over runs on a grid: ``grid`` [G], ``ys`` [R, G] (each run, NaN where it does not reach)."""

    grid: np.ndarray
    ys: np.ndarray

    @cached_property
    def runs(self) -> np.ndarray:
        """[G] how many runs each point averages."""
        return np.sum(~np.isnan(self.ys), axis=0)

    @cached_property
    def mean(self) -> np.ndarray:
        """[G] the mean over the runs that reach each point (NaN where none does)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a point no run reaches: NaN, said by runs == 0
            return np.nanmean(self.ys, axis=0)

    @cached_property
    def se(self) -> np.ndarray:
        """[G] the standard error over runs (sample std / sqrt(runs)); 0 where a single run reaches (the tables' convention)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            sd = np.nanstd(self.ys, axis=0, ddof=1)
        return np.where(self.runs > 1, sd / np.sqrt(np.maximum(self.runs, 1)), 0.0)

    def covered(self) -> MeanCurve:
        """The points that average at least half of the most runs any point averages (a tail that only the longest
        runs cover would be noise); with a fine grid to the median end, that is every point."""
        keep = 2 * self.runs >= self.runs.max()
        return MeanCurve(self.grid[keep], self.ys[:, keep])

    def reach(self, target: float) -> float | None:
        """The first grid x where the mean reaches ``target`` (None if it never does)."""
        return first_reach(self.grid, self.mean, target)


def fine_grid(curves: list[Curve], end: float | None = None) -> np.ndarray:
    """[GRID + 1] points from 0 to ``end`` (default: the median of the curves' ends, see the module docstring)."""
    ends = sorted((float(xs[-1]) for xs, _ in curves), reverse=True)
    end = ends[(len(ends) - 1) // 2] if end is None else end
    return np.linspace(0.0, end, GRID + 1)


def eval_grid(curves: list[Curve]) -> np.ndarray:
    """0 to the latest x of any curve, spaced by the median gap between consecutive points of a curve."""
    gaps = [g for xs, _ in curves for g in np.diff(xs)]
    end = max((float(xs[-1]) for xs, _ in curves), default=0.0)
    step = float(np.median(gaps)) if gaps else max(end, 1.0)
    return np.arange(0.0, end + step / 2, step)


def mean_curve(curves: list[Curve], grid: np.ndarray | None = None) -> MeanCurve:
    """The mean of ``curves`` on ``grid`` (default ``fine_grid``)."""
    grid = fine_grid(curves) if grid is None else np.asarray(grid, dtype=float)
    return MeanCurve(grid, on_grid(curves, grid))


def first_reach(grid: np.ndarray, mean: np.ndarray, target: float) -> float | None:
    """The first grid x where ``mean`` >= ``target`` (None if never); grid, mean: [G]."""
    hit = np.nonzero(mean >= target - 1e-12)[0]
    return float(grid[hit[0]]) if hit.size else None


def ratio(t_base: float | None, t_arm: float | None) -> float:
    """``t_base / t_arm``: 0 when the arm never reaches the target, 1 when both reach it at the same x."""
    return 0.0 if t_arm is None else 1.0 if t_arm == t_base else t_base / t_arm if t_arm else float("inf")


def speedup(base: list[Curve], arm: list[Curve], frac: float = 0.99) -> dict:
    """Point estimate for per-seed curves ``base`` and ``arm`` on fine grids: target, both times, ratio, both peaks."""
    b, a = mean_curve(base), mean_curve(arm)
    peak = float(np.nanmax(b.mean))
    tb, ta = b.reach(frac * peak), a.reach(frac * peak)
    return {
        "target": frac * peak,
        "t_base": tb,
        "t_arm": ta,
        "speedup": ratio(tb, ta),
        "base_peak": peak,
        "arm_peak": float(np.nanmax(a.mean)),
    }


def bootstrap_speedup(
    base: list[Curve], arm: list[Curve], frac: float = 0.99, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> dict:
    """Percentile-bootstrap interval of ``speedup`` over seeds (each arm resampled with replacement).

    Returns lo, hi (the ``level`` interval), ``never`` (fraction of resamples where the arm never reached the
    target) and ``samples`` (the n_boot ratios). One seed per arm gives a zero-width interval."""
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(n_boot):
        b = [base[i] for i in rng.integers(0, len(base), len(base))]
        a = [arm[i] for i in rng.integers(0, len(arm), len(arm))]
        ratios.append(speedup(b, a, frac)["speedup"])
    r = np.array(ratios)
    q = (1 - level) / 2
    return {"lo": float(np.quantile(r, q)), "hi": float(np.quantile(r, 1 - q)), "never": float(np.mean(r == 0.0)), "samples": r}


def curve_rows(label: str, mc: MeanCurve, source: str = "ours") -> list[dict]:
    """The table of one mean curve (``CURVE_FIELDS``): one row per grid point some run reaches, band mean +- 1.96 SE."""
    return [
        {"source": source, "label": label, "time": float(t), "mean": float(m), "lo": float(m - 1.96 * s), "hi": float(m + 1.96 * s),
         "se": float(s), "runs": int(k)}
        for t, m, s, k in zip(mc.grid, mc.mean, mc.se, mc.runs)
        if k
    ]  # fmt: skip


def band(curves: list[Curve], n_eval: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid [G], mean [G], 1.96 SE [G]) on the fine grid: the SE over seeds (NaN where a single run reaches), or,
    for a single seed, the binomial SE of an accuracy measured on ``n_eval`` samples."""
    mc = mean_curve(curves)
    if len(curves) > 1:
        return mc.grid, mc.mean, np.where(mc.runs > 1, 1.96 * mc.se, np.nan)
    return mc.grid, mc.mean, 1.96 * np.sqrt(np.clip(mc.mean * (1 - mc.mean), 0, None) / max(n_eval, 1))


def mean_curves(groups: dict[str, list[Curve]], grid: np.ndarray | None = None) -> dict[str, MeanCurve]:
    """Per label, the mean of its curves on one common ``grid`` (default: ``eval_grid`` of all of them); empty
    curves (runs with no such point yet) and labels left without a curve are left out."""
    groups = {label: [c for c in cs if len(c[0])] for label, cs in groups.items()}
    groups = {label: cs for label, cs in groups.items() if cs}
    grid = eval_grid([c for cs in groups.values() for c in cs]) if grid is None else grid
    return {label: mean_curve(cs, grid) for label, cs in groups.items()}
