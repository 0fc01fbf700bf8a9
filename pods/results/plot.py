"""The one plotting helper: mean curves with shaded 1.96-SE bands, one colour per label (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from pods.results.curves import band
from pods.results.runs import Run

TIME_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
TIME_LABEL = "training wall-clock ({}, evaluation excluded)"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def plot_runs(runs: dict[str, list[Run]], path: str | Path, title: str = "") -> Path:
    """Two panels, test accuracy against training seconds and against optimizer steps: each label's mean on the
    fine grid with its band (``curves.band``) and every run's evaluations as dots."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (x, xlabel) in zip(axes, (("time", TIME_LABEL.format("s")), ("step", "optimizer steps"))):
        for i, (label, rs) in enumerate(runs.items()):
            grid, mean, ci = band([r.curve(x) for r in rs], rs[0].n_eval)
            ax.plot(grid, mean, color=f"C{i}", label=f"{label} ({len(rs)} seed{'s' if len(rs) > 1 else ''})")
            ax.fill_between(grid, mean - ci, mean + ci, color=f"C{i}", alpha=0.2, lw=0)
            for r in rs:
                ax.plot(*r.curve(x), color=f"C{i}", ls="none", marker="o", ms=2, alpha=0.5)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (band: 1.96 SE)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)


def plot_curves(
    curves: list[dict], path: str | Path, title: str = "", time_unit: str = "s", ylabel: str = "test accuracy", xlabel: str | None = None
) -> Path:
    """Mean lines with shaded bands from ``curves.curve_rows`` tables; the same label from another ``source`` (the
    authors') is dashed. ``time`` is in seconds, drawn in ``time_unit``; ``xlabel`` names another x (steps)."""
    scale = TIME_UNITS[time_unit]
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.2))
    sources = list(dict.fromkeys(c["source"] for c in curves))
    for i, label in enumerate(dict.fromkeys(c["label"] for c in curves)):
        for j, source in enumerate(sources):
            pts = sorted(
                (c["time"] / scale, c["mean"], c["lo"], c["hi"], c["runs"]) for c in curves if (c["label"], c["source"]) == (label, source)
            )
            if not pts:
                continue
            t, m, lo, hi, k = zip(*pts)
            name = label if sources == ["ours"] else f"{label} ({source}, {max(k)} runs)"
            ax.plot(t, m, color=f"C{i}", ls="-" if j == 0 else "--", marker="o" if j == 0 else None, ms=3, label=name)
            ax.fill_between(t, lo, hi, color=f"C{i}", alpha=0.2 if j == 0 else 0.08, lw=0)
    ax.set(xlabel=xlabel or TIME_LABEL.format(time_unit), ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
