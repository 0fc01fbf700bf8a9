"""The paper's metric from runs' own metrics.jsonl: speed-up to 99% of a baseline's best mean accuracy.

A run is reduced to its eval curve (accuracy against training seconds and against optimizer steps) and a few
per-step costs from its train rows. For an arm and a baseline, both with one or more seeds:

- each arm's mean curve is the mean over its seeds of their curves, linearly interpolated onto a fine grid
  from 0 to the median of the seeds' ends (each point averages the seeds that reach it; nothing extrapolated);
- the target is ``frac`` (0.99) times the maximum of the baseline's mean curve;
- the time to target is the first grid point where a mean curve reaches it (the grid is interpolated, so this
  is the crossing time to within 1/``GRID`` of the span); the speed-up is ``t_baseline / t_arm``;
- its 95% interval is the percentile bootstrap over seeds: every resample draws each arm's seeds with
  replacement (independently), recomputes both mean curves, the target and the ratio. A resample in which the
  arm never reaches the target counts as a speed-up of 0 (reported as ``never``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pods.metrics import read_metrics

GRID = 400  # grid intervals per arm span


@dataclass
class Run:
    """One run's eval curve and costs. ``evals`` rows: (step, train_time, accuracy, n_eval)."""

    run_dir: str
    evals: list[tuple[int, float, float, int]]
    steps: int = 0
    train_time: float = 0.0
    s_per_step: float = float("nan")
    zero_var: float = float("nan")
    t_generate: float = float("nan")
    t_update: float = float("nan")
    extra: dict = field(default_factory=dict)

    def curve(self, x: str) -> tuple[np.ndarray, np.ndarray]:
        """(xs, accuracy) against ``x`` = ``time`` (training seconds) or ``step``; one point per x (last wins)."""
        pts = {float(s if x == "step" else t): a for s, t, a, _ in self.evals}
        xs = np.array(sorted(pts))
        return xs, np.array([pts[k] for k in xs])


def load_run(run_dir: str | Path) -> Run:
    """Read ``run_dir/metrics.jsonl``: eval rows, and medians of the per-step costs over the train rows."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    evals = [(r["step"], r["train_time"], r["accuracy"], r.get("n_eval") or 0) for r in rows if r.get("kind") == "eval"]
    train = [r for r in rows if r.get("kind") == "train"]
    run = Run(str(run_dir), evals)
    if train:
        times = [0.0] + [r["train_time"] for r in train]
        med = lambda k: statistics.median(r[k] for r in train if r.get(k) is not None)  # noqa: E731
        run.steps, run.train_time = train[-1]["step"], train[-1]["train_time"]
        run.s_per_step = statistics.median(b - a for a, b in zip(times, times[1:]))
        run.zero_var = statistics.fmean(r["zero_var_groups"] for r in train)
        run.t_generate, run.t_update = med("t_generate"), med("t_update")
    return run


def mean_curve(curves: list[tuple[np.ndarray, np.ndarray]], end: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Mean over runs of their curves on ``GRID + 1`` points from 0 to ``end``.

    curves: per run (xs [K], ys [K]); returns (grid [GRID+1], mean [GRID+1]). Default ``end``: the furthest x that
    at least half of the runs reach (their median end: under a changing machine load, seeds with the same step
    budget end at different seconds). Each grid point averages the runs that reach it; nothing is extrapolated."""
    ends = sorted((float(xs[-1]) for xs, _ in curves), reverse=True)
    end = ends[(len(ends) - 1) // 2] if end is None else end
    grid = np.linspace(0.0, end, GRID + 1)
    ys = np.array([np.where(grid <= xs[-1] + 1e-9, np.interp(grid, xs, y), np.nan) for xs, y in curves])
    return grid, np.nanmean(ys, axis=0)


def first_reach(grid: np.ndarray, mean: np.ndarray, target: float) -> float | None:
    """The first grid x where ``mean`` >= ``target`` (None if never); grid, mean: [G]."""
    hit = np.nonzero(mean >= target - 1e-12)[0]
    return float(grid[hit[0]]) if hit.size else None


def speedup(base: list, arm: list, frac: float = 0.99) -> dict:
    """Point estimate for per-seed curves ``base`` and ``arm`` (lists of (xs, ys)): target, both times, ratio."""
    gb, mb = mean_curve(base)
    ga, ma = mean_curve(arm)
    target = frac * float(mb.max())
    tb, ta = first_reach(gb, mb, target), first_reach(ga, ma, target)
    ratio = 0.0 if ta is None else 1.0 if ta == tb else tb / ta if ta else float("inf")
    return {"target": target, "t_base": tb, "t_arm": ta, "speedup": ratio, "base_peak": float(mb.max()), "arm_peak": float(ma.max())}


def bootstrap_speedup(base: list, arm: list, frac: float = 0.99, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
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


def compare(runs: dict[str, list[Run]], baseline: str, arm: str, x: str = "time", frac: float = 0.99, n_boot: int = 2000) -> dict:
    """Speed-up of ``arm`` over ``baseline`` against ``x`` (``time`` or ``step``), point estimate + bootstrap."""
    base = [r.curve(x) for r in runs[baseline]]
    other = [r.curve(x) for r in runs[arm]]
    out = {"baseline": baseline, "arm": arm, "x": x, **speedup(base, other, frac)}
    boot = bootstrap_speedup(base, other, frac, n_boot)
    return {**out, "lo": boot["lo"], "hi": boot["hi"], "never": boot["never"]}


def arm_summary(runs: list[Run]) -> dict:
    """Start and peak of the mean time curve with 1.96 SE (over seeds; one seed: over eval samples), and costs."""
    grid, mean, ci = band(runs, "time")
    k = int(np.argmax(mean))
    se = ci / 1.96
    avg = lambda k: float(np.mean([getattr(r, k) for r in runs]))  # noqa: E731
    return {
        "seeds": len(runs),
        "start": float(mean[0]),
        "start_ci": 1.96 * float(se[0]),
        "peak": float(mean[k]),
        "peak_ci": 1.96 * float(se[k]),
        "peak_time": float(grid[k]),
        "end_time": float(grid[-1]),
        "steps": avg("steps"),
        "s_per_step": avg("s_per_step"),
        "zero_var": avg("zero_var"),
        "t_generate": avg("t_generate"),
        "t_update": avg("t_update"),
    }


def report(runs: dict[str, list[Run]], comparisons: list[tuple[str, str]], n_boot: int = 2000) -> list[str]:
    """The printed summary: one line per arm, then each comparison against time and against steps."""
    lines = [
        f"{'arm':18s} {'seeds':>5s} {'start':>13s} {'peak':>13s} {'at (s)':>7s} {'steps':>7s} {'s/step':>7s} "
        f"{'gen/upd (ms)':>13s} {'zero-var':>8s}"
    ]
    for label, rs in runs.items():
        s = arm_summary(rs)
        lines.append(
            f"{label:18s} {s['seeds']:5d} {s['start']:6.3f}±{s['start_ci']:.3f} {s['peak']:6.3f}±{s['peak_ci']:.3f} {s['peak_time']:7.0f} "
            f"{s['steps']:7.0f} {s['s_per_step']:7.3f} {1e3 * s['t_generate']:6.0f}/{1e3 * s['t_update']:<6.0f} {s['zero_var']:8.3f}"
        )
    for baseline, arm in comparisons:
        if baseline not in runs or arm not in runs:
            continue
        b, a = arm_summary(runs[baseline]), arm_summary(runs[arm])
        lines.append(
            f"{arm} vs {baseline}: a step costs {a['s_per_step'] / b['s_per_step']:.2f}x (generation {a['t_generate'] / b['t_generate']:.2f}x, "
            f"update {a['t_update'] / b['t_update']:.2f}x); {100 * b['zero_var']:.1f}% of {baseline}'s prompt groups had zero reward variance"
        )
        for x, unit in (("time", "s"), ("step", "steps")):
            c = compare(runs, baseline, arm, x, n_boot=n_boot)
            t_arm = "never" if c["t_arm"] is None else f"{c['t_arm']:.0f} {unit}"
            never = f", never in {100 * c['never']:.0f}% of resamples" if c["never"] else ""
            lines.append(
                f"{arm} vs {baseline} by {x}: to {c['target']:.3f} (99% of {baseline}'s best mean {c['base_peak']:.3f}) "
                f"{baseline} {c['t_base']:.0f} {unit}, {arm} {t_arm}: speed-up {c['speedup']:.2f}x "
                f"[95% {c['lo']:.2f}, {c['hi']:.2f}]{never}"
            )
    return lines


def band(runs: list[Run], x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, mean, 1.96 SE) of the runs' curves against ``x``: SE over seeds, or for one seed over eval samples."""
    grid, mean = mean_curve([r.curve(x) for r in runs])
    if len(runs) > 1:  # over the runs that reach each grid point (at least half of them)
        ys = np.array([np.where(grid <= xs[-1] + 1e-9, np.interp(grid, xs, y), np.nan) for xs, y in (r.curve(x) for r in runs)])
        k = np.sum(~np.isnan(ys), axis=0)
        return grid, mean, 1.96 * np.nanstd(ys, axis=0, ddof=1) / np.sqrt(k)
    return grid, mean, 1.96 * np.sqrt(np.clip(mean * (1 - mean), 0, None) / max(runs[0].evals[0][3], 1))


def plot_runs(runs: dict[str, list[Run]], path: str | Path, title: str = "") -> Path:
    """Two panels, test accuracy against training seconds and against optimizer steps, mean +- 1.96 SE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (x, xlabel) in zip(axes, (("time", "training wall-clock (s, evaluation excluded)"), ("step", "optimizer steps"))):
        for i, (label, rs) in enumerate(runs.items()):
            grid, mean, ci = band(rs, x)
            ax.plot(grid, mean, color=f"C{i}", label=f"{label} ({len(rs)} seed{'s' if len(rs) > 1 else ''})")
            ax.fill_between(grid, mean - ci, mean + ci, color=f"C{i}", alpha=0.2, lw=0)
            for r in rs:
                ax.plot(*r.curve(x), color=f"C{i}", ls="none", marker="o", ms=2, alpha=0.5)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (band: 1.96 SE)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


CSV_FIELDS = ["label", "run_dir", "step", "train_time", "accuracy", "n_eval"]


def write_evals(runs: dict[str, list[Run]], path: str | Path) -> Path:
    """Every eval of every run as CSV rows (label, run_dir, step, train_time, accuracy, n_eval)."""
    import csv

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for label, rs in runs.items():
            for r in rs:
                w.writerows([label, r.run_dir, s, round(t, 3), a, n] for s, t, a, n in r.evals)
    return path
