"""What is written from runs: CSV tables and the printed summaries with the paper's speed-up metric.

- ``speedup_report``: per arm, start and peak of the mean time curve (fine grid) with 1.96 SE and per-step costs,
  then each comparison against training seconds and against optimizer steps: the band metric (``pods.results.speedup``)
  per seed pair and pooled, then the paper's 99%-of-peak metric (the CPU demo and ``make reproduce-figure-cpu``);
  bootstrap intervals only from 3 seeds per arm.
- ``figure_summary``: first / best / last point of each mean curve on a figure's common grid and the time to 99%
  of the baseline's best (``make figure-*``, ours and the authors' curves alike).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from pods.files import atomic
from pods.results.curves import CURVE_FIELDS, MeanCurve, band, bootstrap_speedup, curve_rows, ratio, speedup
from pods.results.runs import Run
from pods.results.speedup import BAND, MIN_SEEDS_FOR_INTERVAL, Band, band_line, budget_note

EVAL_FIELDS = [
    "label",
    "run_dir",
    "step",
    "train_time",
    "accuracy",
    "format_accuracy",
    "both_accuracy",
    "reward",
    "mean_length",
    "answer_prob",
]


def write_csv(rows: list[dict], path: str | Path, fields: list[str]) -> Path:
    """``rows`` as a CSV at ``path``, whole or not at all (a failure leaves the old file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def eval_rows(groups: dict[str, list[Run]], fields: list[str] = EVAL_FIELDS) -> list[dict]:
    """Every evaluation of every run: label, run_dir and the eval row's ``fields`` (empty where a row lacks one)."""
    return [
        {"label": label, "run_dir": r.run_dir, **{k: e.get(k) for k in fields[2:]}}
        for label, rs in groups.items()
        for r in rs
        for e in r.evals
    ]


def table(curves: dict[str, MeanCurve], source: str = "ours") -> list[dict]:
    """``CURVE_FIELDS`` rows of every label's mean curve."""
    return [row for label, mc in curves.items() for row in curve_rows(label, mc, source)]


def write_curves(curves: list[dict], path: str | Path) -> Path:
    return write_csv(curves, path, CURVE_FIELDS)


# ---- the demo's and the CPU figure's summary ---------------------------------------------------------------
def arm_summary(runs: list[Run]) -> dict:
    """Start and peak of the mean time curve with 1.96 SE (over seeds; one seed: over eval samples), and costs."""
    grid, mean, ci = band([r.curve("time") for r in runs], runs[0].n_eval)
    k = int(np.argmax(mean))
    se = ci / 1.96
    out = {"seeds": len(runs), "start": float(mean[0]), "start_ci": 1.96 * float(se[0]), "peak": float(mean[k])}
    out.update(peak_ci=1.96 * float(se[k]), peak_time=float(grid[k]), end_time=float(grid[-1]))
    for key in ("steps", "s_per_step", "zero_var", "t_generate", "t_update"):
        out[key] = float(np.mean([r.costs[key] for r in runs]))
    return out


def compare(runs: dict[str, list[Run]], baseline: str, arm: str, x: str = "time", frac: float = 0.99, n_boot: int = 2000) -> dict:
    """Speed-up of ``arm`` over ``baseline`` against ``x`` (``time`` or ``step``), point estimate + bootstrap."""
    base = [r.curve(x) for r in runs[baseline]]
    other = [r.curve(x) for r in runs[arm]]
    out = {"baseline": baseline, "arm": arm, "x": x, **speedup(base, other, frac)}
    boot = bootstrap_speedup(base, other, frac, n_boot)
    return {**out, "lo": boot["lo"], "hi": boot["hi"], "never": boot["never"]}


def speedup_report(runs: dict[str, list[Run]], comparisons: list[tuple[str, str]], n_boot: int = 2000, band: Band = BAND) -> list[str]:
    """The printed summary: one line per arm, then each (baseline, arm) comparison's costs and speed-ups."""
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
        if baseline in runs and arm in runs:
            lines += _comparison(runs, baseline, arm, n_boot, band)
    return lines


def _comparison(runs: dict[str, list[Run]], baseline: str, arm: str, n_boot: int, band: Band = BAND) -> list[str]:
    """The step-cost line, then per x (seconds, steps): the band metric on sampled accuracy (and on answer_prob when
    the runs logged it), then the paper's 99%-of-peak metric, flagged when the baseline is budget-bound."""
    b, a = arm_summary(runs[baseline]), arm_summary(runs[arm])
    lines = [
        f"{arm} vs {baseline}: a step costs {a['s_per_step'] / b['s_per_step']:.2f}x (generation {a['t_generate'] / b['t_generate']:.2f}x, "
        f"update {a['t_update'] / b['t_update']:.2f}x); {100 * b['zero_var']:.1f}% of {baseline}'s prompt groups had zero reward variance"
    ]
    for x, unit in (("time", "s"), ("step", "steps")):
        base, other = [r.curve(x) for r in runs[baseline]], [r.curve(x) for r in runs[arm]]
        lines.append(band_line(f"{arm} vs {baseline}", x, base, other, band, n_boot))
        probs = [[r.curve(x, "answer_prob") for r in runs[k]] for k in (baseline, arm)]
        if all(len(c[0]) > 1 for cs in probs for c in cs):
            lines.append(band_line(f"{arm} vs {baseline}", x, *probs, band, n_boot, source="answer_prob"))
        c = compare(runs, baseline, arm, x, n_boot=n_boot)
        t_arm = "never" if c["t_arm"] is None else f"{c['t_arm']:.0f} {unit}"
        never = f", never in {100 * c['never']:.0f}% of resamples" if c["never"] else ""
        interval = f" [95% {c['lo']:.2f}, {c['hi']:.2f}]" if min(len(base), len(other)) >= MIN_SEEDS_FOR_INTERVAL else ""
        lines.append(
            f"{arm} vs {baseline} by {x}, 99% of peak (sampled accuracy): to {c['target']:.3f} (99% of {baseline}'s best mean "
            f"{c['base_peak']:.3f}) {baseline} {c['t_base']:.0f} {unit}, {arm} {t_arm}: speed-up {c['speedup']:.2f}x"
            f"{interval}{never}{budget_note(base, baseline)}"
        )
    return lines


# ---- the paper figures' summary ------------------------------------------------------------------------------
def figure_summary(curves: dict[str, dict[str, MeanCurve]], baseline: str | None) -> list[str]:
    """Per source (ours, the authors'): first / best / last point of each mean curve, then how much sooner each
    curve first reaches 99% of the baseline's best mean. Only points averaging at least half of a curve's runs
    count (``MeanCurve.covered``)."""
    lines = []
    for source, by_label in curves.items():
        pts = {label: mc.covered() for label, mc in by_label.items()}
        for label, mc in pts.items():
            k = int(np.argmax(mc.mean))
            lines.append(
                f"{source:7s} {label:22s} runs {int(by_label[label].runs.max()):2d}  first {mc.mean[0]:.3f} at {mc.grid[0]:.0f} s  "
                f"best {mc.mean[k]:.3f} +- {1.96 * mc.se[k]:.3f} at {mc.grid[k]:.0f} s  last {mc.mean[-1]:.3f} at {mc.grid[-1]:.0f} s"
            )
        if baseline in pts:
            target = 0.99 * float(np.max(pts[baseline].mean))
            t_base = pts[baseline].reach(target)
            for label in (k for k in pts if k != baseline):
                t = pts[label].reach(target)
                text = f"{ratio(t_base, t):.2f}x" if t and t_base else ("n/a (never reached)" if t is None else "n/a")
                lines.append(
                    f"{source:7s} time to 99% of {baseline}'s best mean ({target:.3f}): {baseline} {t_base:.0f} s, "
                    f"{label} {'never' if t is None else f'{t:.0f} s'}: speed-up {text}"
                )
    return lines


def figure_bands(curves: dict[str, dict[str, list]], baseline: str | None, band: Band = BAND, n_boot: int = 2000) -> list[str]:
    """Per source (ours, the authors'): each curve's band speed-up over the baseline against time, per seed pair and
    pooled over seeds (``curves``: source -> label -> per-seed curves), and the 99% metric's budget-bound flag."""
    lines = []
    for source, by_label in curves.items():
        if baseline not in by_label:
            continue
        base = by_label[baseline]
        for label in (k for k in by_label if k != baseline):
            lines.append(f"{source:7s} " + band_line(f"{label} vs {baseline}", "time", base, by_label[label], band, n_boot))
        note = budget_note(base, baseline)
        if note:
            lines.append(f"{source:7s} 99% of peak:{note}")
    return lines
