"""The CPU D3S comparison's outputs from finished runs: GRPO vs PODS vs D3S-I vs D3S-C.

``python -m pods.d3s_report --runs results/cpu/d3s/runs --out results/cpu/d3s`` reads every run's config.json
and metrics.jsonl under ``--runs`` and writes: accuracy against training time and against optimizer steps (mean
+- 1.96 SE over seeds), the policy-gradient norm against steps, and ``summary.csv`` (one row per arm: steps,
accuracy at start / best / end, gradient norm, rollouts and tokens generated and trained, token fraction kept,
entropy of kept vs dropped tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pods.metrics import read_metrics
from pods.plot import mean_curves, plot_mean_curves, write_csv

NAMES = {"grpo": "GRPO", "grpo_pods": "PODS", "d3s": "D3S-I", "d3s_cross": "D3S-C"}
SUMMARY = [
    "arm",
    "runs",
    "steps",
    "train_time_s",
    "acc_start",
    "acc_best",
    "acc_end",
    "acc_end_se",
    "grad_norm_mean",
    "kept_per_step",
    "tokens_generated",
    "tokens_trained",
    "tokens_trained_frac",
    "tokens_kept_frac",
    "entropy_kept",
    "entropy_dropped",
]


def label(a: dict) -> str:
    """GRPO 16/16, PODS 64->16, D3S-I 16->4..8 (N at p = 0 .. p = 1)."""
    if a["rule"] == "all":
        return f"{NAMES.get(a['name'], a['name'])} {a['n']}/{a['m']}"
    span = f"{a['m']}..{a['m_final']}" if a.get("m_final") else f"{a['m']}"
    return f"{NAMES.get(a['name'], a['name'])} {a['n']}→{span}"


def load(root: Path) -> dict[str, list[tuple[list[dict], list[dict]]]]:
    """Per arm label: each run's (train rows, eval rows)."""
    arms: dict[str, list] = {}
    for cfg in sorted(root.rglob("config.json")):
        if (cfg.parent / "metrics.jsonl").exists():
            a = json.loads(cfg.read_text())["algorithm"]
            rows = read_metrics(cfg.parent / "metrics.jsonl")
            arms.setdefault(label(a), []).append(([r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "eval"]))
    return arms


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def summarize(arms: dict) -> list[dict]:
    out = []
    for arm, runs in arms.items():
        ends = [ev[-1]["accuracy"] for _, ev in runs if ev]
        gen = [sum(r["tokens"] for r in tr) for tr, _ in runs]
        trained = [sum(r["tokens_trained"] for r in tr) for tr, _ in runs]
        out.append(
            {
                "arm": arm,
                "runs": len(runs),
                "steps": _mean(len(tr) for tr, _ in runs),
                "train_time_s": _mean(tr[-1]["train_time"] for tr, _ in runs if tr),
                "acc_start": _mean(ev[0]["accuracy"] for _, ev in runs if ev),
                "acc_best": _mean(max(e["accuracy"] for e in ev) for _, ev in runs if ev),
                "acc_end": _mean(ends),
                "acc_end_se": statistics.stdev(ends) / len(ends) ** 0.5 if len(ends) > 1 else 0.0,
                "grad_norm_mean": _mean(r["grad_norm"] for tr, _ in runs for r in tr),
                "kept_per_step": _mean(r["kept"] for tr, _ in runs for r in tr),
                "tokens_generated": _mean(gen),
                "tokens_trained": _mean(trained),
                "tokens_trained_frac": _mean(t / g for t, g in zip(trained, gen) if g),
                "tokens_kept_frac": _mean(r.get("tokens_kept_frac") for tr, _ in runs for r in tr),
                "entropy_kept": _mean(r.get("entropy_kept") for tr, _ in runs for r in tr),
                "entropy_dropped": _mean(r.get("entropy_dropped") for tr, _ in runs for r in tr),
            }
        )
    return out


def report(root: Path, out: Path) -> list[dict]:
    arms = load(root)
    by_time = [
        {"label": arm, "run_dir": str(i), "train_time": e["train_time"], "accuracy": e["accuracy"]}
        for arm, runs in arms.items()
        for i, (_, ev) in enumerate(runs)
        for e in ev
    ]
    by_step = [{**r, "train_time": e["step"]} for r, e in zip(by_time, (e for runs in arms.values() for _, ev in runs for e in ev))]
    grads = [
        {"label": arm, "run_dir": str(i), "train_time": r["step"], "accuracy": r["grad_norm"]}
        for arm, runs in arms.items()
        for i, (tr, _) in enumerate(runs)
        for r in tr
    ]
    title = "toy arithmetic, tiny Qwen2, CPU: GRPO vs PODS vs D3S"
    for name, rows, unit, ylabel, every in [
        ("accuracy_vs_time", by_time, "s", "test accuracy", 5),
        ("accuracy_vs_step", by_step, "s", "test accuracy", 25),
        ("grad_norm_vs_step", grads, "s", "policy gradient norm (pre-clip)", 10),
    ]:
        end = max(r["train_time"] for r in rows)
        curves = mean_curves(rows, grid=[every * i for i in range(int(end // every) + 1)])  # points where runs have data
        write_csv(curves, out / f"{name}.csv", ["source", "label", "time", "mean", "lo", "hi", "se", "runs"])
        path = plot_mean_curves(curves, out / f"{name}.png", title, unit, ylabel)
        if "step" in name:  # the x axis is optimizer steps, not seconds
            _relabel(path, curves, title, ylabel)
    summary = summarize(arms)
    write_csv(summary, out / "summary.csv", SUMMARY)
    return summary


def _relabel(path: Path, curves: list[dict], title: str, ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, lab in enumerate(dict.fromkeys(c["label"] for c in curves)):
        pts = sorted((c["time"], c["mean"], c["lo"], c["hi"]) for c in curves if c["label"] == lab)
        t, m, lo, hi = zip(*pts)
        ax.plot(t, m, color=f"C{i}", label=lab)
        ax.fill_between(t, lo, hi, color=f"C{i}", alpha=0.2, lw=0)
    ax.set(xlabel="optimizer step", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=Path("results/cpu/d3s/runs"))
    p.add_argument("--out", type=Path, default=Path("results/cpu/d3s"))
    args = p.parse_args(argv)
    for row in report(args.runs, args.out):
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})


if __name__ == "__main__":
    main()
