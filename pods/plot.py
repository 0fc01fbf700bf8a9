"""Curves from finished runs: eval accuracy against TRAINING wall-clock, read from each run's metrics.jsonl."""

from __future__ import annotations

import csv
from pathlib import Path

from pods.metrics import read_metrics

FIELDS = ["label", "run_dir", "step", "train_time", "accuracy", "format_accuracy", "both_accuracy", "reward", "mean_length"]


def eval_rows(runs: dict[str, list[str | Path]]) -> list[dict]:
    """One row per eval of every run; ``runs`` maps a curve label to its run directories (seeds)."""
    out = []
    for label, dirs in runs.items():
        for d in dirs:
            for r in read_metrics(Path(d) / "metrics.jsonl", kind="eval"):
                out.append({"label": label, "run_dir": str(d), **{k: r.get(k) for k in FIELDS[2:]}})
    return out


def write_csv(rows: list[dict], path: str | Path, fields: list[str] = FIELDS) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def plot_accuracy_vs_time(rows: list[dict], path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for i, label in enumerate(labels):
        color = f"C{i}"
        for j, run in enumerate(dict.fromkeys(r["run_dir"] for r in rows if r["label"] == label)):
            pts = sorted((r["train_time"], r["accuracy"]) for r in rows if r["run_dir"] == run and r["label"] == label)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, color=color, label=label if j == 0 else None)
    return _save(fig, ax, path, title, "training wall-clock (s, evaluation excluded)", "test accuracy")


def _save(fig, ax, path, title: str, xlabel: str, ylabel: str, legend_size=None) -> Path:
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---- mean +- 1.96 standard errors across seeds on a common time grid (the paper's figures) -------------------

CURVE_FIELDS = ["source", "label", "time", "mean", "lo", "hi", "se", "runs"]


def mean_curves(rows: list[dict], grid: list[float] | None = None, source: str = "ours", metric: str = "accuracy") -> list[dict]:
    """Per label: the mean ``metric`` (default accuracy) over its runs at each grid time, with a 1.96 standard-error band.

    ``rows`` are ``eval_rows``-style dicts (label, run_dir, train_time, accuracy). Each run's curve is linearly
    interpolated onto the grid; a grid time outside a run's evaluated span is left out for that run (never
    extrapolated), so ``runs`` says how many seeds a point averages. Default grid: 0 to the latest evaluation,
    spaced by the median gap between consecutive evaluations. A run evaluated twice at the same time (a resumed
    run's repeat of its final evaluation) counts once, with its last value.
    """
    import numpy as np

    curves: dict[str, dict[str, dict[float, float]]] = {}
    for r in rows:
        if r.get(metric) is not None and r.get("train_time") is not None:
            curves.setdefault(r["label"], {}).setdefault(r["run_dir"], {})[float(r["train_time"])] = float(r[metric])
    if grid is None:
        gaps = [b - a for runs in curves.values() for pts in runs.values() for a, b in zip(sorted(pts), sorted(pts)[1:])]
        end = max((t for runs in curves.values() for pts in runs.values() for t in pts), default=0.0)
        step = float(np.median(gaps)) if gaps else max(end, 1.0)
        grid = list(np.arange(0.0, end + step / 2, step))
    out = []
    for label, runs in curves.items():
        for t in grid:
            ys = [float(np.interp(t, sorted(p), [p[k] for k in sorted(p)])) for p in runs.values() if min(p) <= t <= max(p) + 1e-9]
            if not ys:
                continue
            se = float(np.std(ys, ddof=1) / np.sqrt(len(ys))) if len(ys) > 1 else 0.0
            mean = float(np.mean(ys))
            out.append(
                {
                    "source": source,
                    "label": label,
                    "time": float(t),
                    "mean": mean,
                    "lo": mean - 1.96 * se,
                    "hi": mean + 1.96 * se,
                    "se": se,
                    "runs": len(ys),
                }
            )
    return out


def plot_mean_curves(curves: list[dict], path: str | Path, title: str = "", time_unit: str = "s", ylabel: str = "test accuracy") -> Path:
    """Mean lines with shaded 1.96-SE bands; the same label in another ``source`` (e.g. the authors') is dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = {"s": 1.0, "min": 60.0, "h": 3600.0}[time_unit]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    labels = list(dict.fromkeys(c["label"] for c in curves))
    sources = list(dict.fromkeys(c["source"] for c in curves))
    for i, label in enumerate(labels):
        for j, source in enumerate(sources):
            pts = sorted(
                (c["time"] / scale, c["mean"], c["lo"], c["hi"], c["runs"]) for c in curves if c["label"] == label and c["source"] == source
            )
            if not pts:
                continue
            t, m, lo, hi, k = zip(*pts)
            name = label if sources == ["ours"] else f"{label} ({source}, {max(k)} runs)"
            ax.plot(t, m, color=f"C{i}", ls="-" if j == 0 else "--", marker="o" if j == 0 else None, ms=3, label=name)
            ax.fill_between(t, lo, hi, color=f"C{i}", alpha=0.2 if j == 0 else 0.08, lw=0)
    return _save(fig, ax, path, title, f"training wall-clock ({time_unit}, evaluation excluded)", ylabel, legend_size=8)


def time_to_reach(curves: list[dict], label: str, target: float, source: str = "ours") -> float | None:
    """The first grid time at which ``label``'s mean curve reaches ``target`` (None if it never does)."""
    pts = sorted((c["time"], c["mean"]) for c in curves if c["label"] == label and c["source"] == source)
    return next((t for t, m in pts if m >= target), None)
