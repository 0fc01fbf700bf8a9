"""The CPU D3S comparison's outputs from finished runs: GRPO vs PODS vs D3S-I vs D3S-C.

``python -m pods.results.d3s --runs results/cpu/d3s/runs --out results/cpu/d3s`` reads every run's config.json
and metrics.jsonl under ``--runs`` and writes: accuracy against training time and against optimizer steps (mean
+- 1.96 SE over seeds), the policy-gradient norm against steps, and ``summary.csv`` (one row per arm: steps,
accuracy at start / best / end, gradient norm, rollouts and tokens generated and trained, token fraction kept,
entropy of kept vs dropped tokens).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from pods.results.curves import mean_curves
from pods.results.plot import plot_curves
from pods.results.report import table, write_csv, write_curves
from pods.results.runs import LABELS, Run, find_runs, group, load_run

SUMMARY = [
    "arm", "runs", "steps", "train_time_s", "acc_start", "acc_best", "acc_end", "acc_end_se", "grad_norm_mean", "kept_per_step",
    "tokens_generated", "tokens_trained", "tokens_trained_frac", "tokens_kept_frac", "entropy_kept", "entropy_dropped",
]  # fmt: skip
TITLE = "toy arithmetic, tiny Qwen2, CPU: GRPO vs PODS vs D3S"
PANELS = [  # file name, (x, y, rows), y label, x label, grid spacing (points where the runs have data)
    ("accuracy_vs_time", ("time", "accuracy", "eval"), "test accuracy", None, 5),
    ("accuracy_vs_step", ("step", "accuracy", "eval"), "test accuracy", "optimizer step", 25),
    ("grad_norm_vs_step", ("step", "grad_norm", "train"), "policy gradient norm (pre-clip)", "optimizer step", 10),
]


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def arm_row(arm: str, runs: list[Run]) -> dict:
    """One ``SUMMARY`` row: means over the arm's runs (per-step quantities: over all their train rows)."""
    ends = [r.evals[-1]["accuracy"] for r in runs if r.evals]
    gen = [sum(row["tokens"] for row in r.train) for r in runs]
    trained = [sum(row["tokens_trained"] for row in r.train) for r in runs]

    def per_step(key: str) -> float | None:
        return _mean(t.get(key) for r in runs for t in r.train)

    return {
        "arm": arm,
        "runs": len(runs),
        "steps": _mean(len(r.train) for r in runs),
        "train_time_s": _mean(r.train[-1]["train_time"] for r in runs if r.train),
        "acc_start": _mean(r.evals[0]["accuracy"] for r in runs if r.evals),
        "acc_best": _mean(max(e["accuracy"] for e in r.evals) for r in runs if r.evals),
        "acc_end": _mean(ends),
        "acc_end_se": statistics.stdev(ends) / len(ends) ** 0.5 if len(ends) > 1 else 0.0,
        "grad_norm_mean": per_step("grad_norm"),
        "kept_per_step": per_step("kept"),
        "tokens_generated": _mean(gen),
        "tokens_trained": _mean(trained),
        "tokens_trained_frac": _mean(t / g for t, g in zip(trained, gen) if g),
        "tokens_kept_frac": per_step("tokens_kept_frac"),
        "entropy_kept": per_step("entropy_kept"),
        "entropy_dropped": per_step("entropy_dropped"),
    }


def report(root: Path, out: Path) -> list[dict]:
    """The three figures with their CSVs, and summary.csv; returns the summary rows."""
    arms = group([load_run(d) for d in find_runs(root)], LABELS.get("d3s"))
    for name, (x, y, kind), ylabel, xlabel, every in PANELS:
        curves = {arm: [r.curve(x, y, kind) for r in runs] for arm, runs in arms.items()}
        end = max(float(xs[-1]) for cs in curves.values() for xs, _ in cs if len(xs))
        rows = table(mean_curves(curves, np.array([every * i for i in range(int(end // every) + 1)], dtype=float)))
        write_curves(rows, out / f"{name}.csv")
        plot_curves(rows, out / f"{name}.png", TITLE, "s", ylabel, xlabel)
    summary = [arm_row(arm, runs) for arm, runs in arms.items()]
    write_csv(summary, out / "summary.csv", SUMMARY)
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=Path("results/cpu/d3s/runs"))
    p.add_argument("--out", type=Path, default=Path("results/cpu/d3s"))
    args = p.parse_args(argv)
    for row in report(args.runs, args.out):
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})


if __name__ == "__main__":
    main()
