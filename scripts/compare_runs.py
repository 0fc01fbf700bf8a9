"""Compare two runs, or two sets of seeds: costs, the mean accuracy curves side by side, and the paper's speed-up.

    python scripts/compare_runs.py A B [--x time|step] [--metric accuracy] [--csv table.csv]

A and B are each a run directory (its metrics.jsonl, and config.json for the label, as ``python -m pods.train``
writes them) or a directory with runs below it (their seeds: each curve is then the mean over them). Prints, for
each side, its label (from the algorithm settings), steps, seconds per step and the start / best / last of its
mean curve; then both mean curves on one grid (every evaluation interval; a point only averages the runs that reach it); then,
against training seconds and against optimizer steps, the band speed-up of B over A (``pods.results.speedup``: the
median over a band of accuracy levels of A's time over B's on isotonic fits, per seed pair and pooled, with an
interval from 3 seeds per side) and the paper's metric, how much sooner B reaches 99% of A's best mean accuracy
(``pods.results.curves.speedup``), flagged "budget-bound" when A's best is its last evaluation.
A side without a run, or whose runs have fewer than two evaluations each (no curve), and a ``--csv`` that cannot
be written are refused in one line (exit 2) before anything is read; the table is written whole or not at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing pods

from pods.errors import ConfigError, need  # noqa: E402
from pods.files import writable  # noqa: E402
from pods.results.curves import mean_curve, mean_curves, speedup  # noqa: E402
from pods.results.report import table, write_csv  # noqa: E402
from pods.results.runs import LABELS, Run, load_run  # noqa: E402
from pods.results.speedup import band_line, budget_note  # noqa: E402

UNITS = {"time": "s", "step": "steps"}


def runs_at(path: Path) -> list[Run]:
    """The run at ``path``, or the runs below it (any directory with a metrics.jsonl); [] when there is none."""
    return [load_run(m.parent) for m in sorted(path.rglob("metrics.jsonl"))] if path.is_dir() else []


def curves(runs: list[Run], x: str, metric: str) -> list:
    """The runs' curves of ``metric`` against ``x``, without the runs that have no such evaluation yet."""
    return [c for c in (r.curve(x, metric) for r in runs) if c[0].size]


def describe(side: str, path: Path, runs: list[Run], x: str, metric: str) -> str:
    """One line: the side's label, runs, mean steps and seconds per step, and the start / best / last of its own mean
    curve (the one the 99% line reads A's best from: ``pods.results.curves.speedup``), not of the common grid, whose
    points can fall between the side's evaluations."""
    labels = sorted({LABELS.get("arm")(r.algorithm) for r in runs if r.algorithm}) or ["?"]
    steps = sum(r.costs["steps"] for r in runs) / len(runs)
    s_step = sum(r.costs["s_per_step"] for r in runs) / len(runs)
    mean = mean_curve([c for c in curves(runs, x, metric) if c[0].size > 1]).mean
    mean = mean[~np.isnan(mean)]
    return (
        f"{side}: {path} ({', '.join(labels)}; {len(runs)} run{'s' if len(runs) > 1 else ''}): {steps:.0f} steps, {s_step:.3f} s/step; "
        f"{metric} {mean[0]:.3f} at start, best {mean.max():.3f}, last {mean[-1]:.3f}"
    )


def curve_table(runs: dict[str, list[Run]], x: str, metric: str) -> list[dict]:
    """Both mean curves on one grid: rows (x, A, B) with empty cells where a side has no run there."""
    rows: dict[float, dict] = {}
    for c in table(mean_curves({side: curves(rs, x, metric) for side, rs in runs.items()})):
        rows.setdefault(c["time"], {x: c["time"]})[c["label"]] = round(c["mean"], 4)
    return [rows[k] for k in sorted(rows)]


def comparison(runs: dict[str, list[Run]], x: str, metric: str) -> list[str]:
    """The band metric (per seed pair and pooled; ``pods.results.speedup``), then the paper's 99%-of-peak metric."""
    base, arm = curves(runs["A"], x, metric), curves(runs["B"], x, metric)
    base, arm = [c for c in base if c[0].size > 1], [c for c in arm if c[0].size > 1]
    s = speedup(base, arm)
    unit = UNITS[x]
    t_b = "never" if s["t_arm"] is None else f"{s['t_arm']:.0f} {unit}"
    ratio = "no speed-up: B never reached it" if s["t_arm"] is None else f"speed-up {s['speedup']:.2f}x"  # not "0.00x"
    return [
        band_line("B vs A", x, base, arm, source=metric),
        f"B vs A by {x}, 99% of peak: to {s['target']:.3f} (99% of A's best mean {s['base_peak']:.3f}) A {s['t_base']:.0f} {unit}, "
        f"B {t_b}: {ratio}{budget_note(base, 'A')}",
    ]


def check(args: argparse.Namespace) -> dict[str, list[Run]]:
    """Both sides' runs, each with a curve of ``args.metric``, and ``--csv`` writable; else ``ConfigError``."""
    if args.csv is not None:
        writable(args.csv, "--csv")
    runs = {"A": runs_at(args.a), "B": runs_at(args.b)}
    for side, path in (("A", args.a), ("B", args.b)):
        need(runs[side], f"{side}: no run at {path} (a directory with metrics.jsonl, or one with run directories below it)")
        found = curves(runs[side], "time", args.metric)
        need(found, f"{side}: no evaluation with '{args.metric}' in the runs at {path}")
        most = max(c[0].size for c in found)
        need(most > 1, f"{side}: the runs at {path} have {most} evaluation with '{args.metric}' each: a curve needs two or more")
    return runs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="the baseline: a run directory or a directory of runs")
    p.add_argument("b", type=Path, help="the other arm: a run directory or a directory of runs")
    p.add_argument("--x", choices=list(UNITS), default="time", help="the table's x axis")
    p.add_argument("--metric", default="accuracy", help="an eval metric of metrics.jsonl (accuracy, both_accuracy, reward, ...)")
    p.add_argument("--csv", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)
    try:
        runs = check(args)
    except ConfigError as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    rows = curve_table(runs, args.x, args.metric)
    for side, path in (("A", args.a), ("B", args.b)):
        print(describe(side, path, runs[side], args.x, args.metric))
    print(f"\n{args.x + ' (' + UNITS[args.x] + ')':>12s} {'A':>8s} {'B':>8s}")
    for r in rows:
        print(f"{r[args.x]:12.1f} " + " ".join(f"{r[k]:8.3f}" if k in r else f"{'':8s}" for k in ("A", "B")))
    print()
    for x in UNITS:
        print("\n".join(comparison(runs, x, args.metric)))
    if args.csv:
        write_csv(rows, args.csv, [args.x, "A", "B"])


if __name__ == "__main__":
    main()
