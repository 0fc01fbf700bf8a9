"""The CPU Sparse-RL comparison on the toy task (results/cpu/sparse_rl/): dense GRPO vs compressed-KV rollouts
without / with the correction, 60 s of training per run.

    python scripts/sparse_rl_toy.py run [--seeds 0 1 2]   # the 9 runs: the 3 arms of a seed at the same time (nice 5)
    python scripts/sparse_rl_toy.py report                # summary.csv, accuracy_vs_time.csv, metrics copies, the table

``run`` launches ``python -m pods.train experiment=ARM seed=S`` for the arms (``ARMS``) into
``runs/sparse_rl_toy/<arm>_s<seed>``, one torch thread each, skipping finished runs, and appends ``uptime`` to
``load.txt`` every 30 s (``scripts/sparse_rl_long.py``'s runner). The experiments' budget is seconds, so step
counts and accuracies follow the machine's speed and load. ``report`` writes ``summary.csv`` (one row per run:
steps, accuracies, and the means over its train rows), ``accuracy_vs_time.csv`` (every evaluation),
``<arm>_s<seed>.metrics.jsonl`` and prints the README's table (mean +- sd over seeds), each file whole or not at
all; without a finished run it refuses in one line (exit 2) and writes nothing.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing pods

from pods.errors import ConfigError  # noqa: E402
from pods.files import atomic, writable  # noqa: E402

ARMS = {"dense": "sparse_rl_toy_dense_cpu", "sparse": "sparse_rl_toy_uncorrected_cpu", "sparse_rl": "sparse_rl_toy_cpu"}
NAMES = {"dense": "dense GRPO", "sparse": "sparse, uncorrected", "sparse_rl": "Sparse-RL"}
RUNS = ROOT / "runs" / "sparse_rl_toy"
OUT = ROOT / "results" / "cpu" / "sparse_rl"
MEANS = {  # summary column: train-row key (mean over the run's steps)
    "t_generate_mean": "t_generate",
    "kv_bytes_dense": "kv_bytes_dense",
    "kv_bytes_sparse": "kv_bytes_sparse",
    "kv_saving": "kv_saving",
    "rejected_frac": "sparse_rl_rejected_frac",
    "masked_frac": "sparse_rl_masked_frac",
    "weight_max": "sparse_rl_weight_max",
    "mismatch_kl": "mismatch_kl",
}


def _long():
    spec = importlib.util.spec_from_file_location("sparse_rl_long", ROOT / "scripts" / "sparse_rl_long.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def jobs_for(seeds: list[int], runs: Path = RUNS) -> list[tuple[list[str], Path]]:
    out = []
    for seed in seeds:
        for arm, experiment in ARMS.items():
            d = runs / f"{arm}_s{seed}"
            cmd = ["nice", "-n", "5", sys.executable, "-m", "pods.train", f"experiment={experiment}", f"seed={seed}"]
            out.append((cmd + ["train.save_final=true", f"hydra.run.dir={d}"], d))
    return out


def run_row(arm: str, seed: int, d: Path) -> tuple[dict, list[dict]]:
    """One run's summary row and its evaluation rows, from its metrics.jsonl."""
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    last = train[-1]
    row = {
        "arm": arm,
        "seed": seed,
        "steps": last["step"],
        "train_time": round(last["train_time"], 1),
        "acc_start": evals[0]["accuracy"],
        "acc_final": evals[-1]["accuracy"],
        "acc_best": max(r["accuracy"] for r in evals),
        "s_per_step": round(last["train_time"] / last["step"], 4),
    }
    for col, key in MEANS.items():
        row[col] = statistics.fmean(r[key] for r in train) if key in last else ""
    row["t_generate_mean"] = round(row["t_generate_mean"], 4)
    curve = [
        {"arm": arm, "seed": seed, "step": r["step"], "train_time": round(r["train_time"], 2), "accuracy": r["accuracy"]} for r in evals
    ]
    return row, curve


def table(rows: list[dict]) -> list[str]:
    """The README's table: per arm, mean +- sd over seeds."""

    def msd(xs):
        return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)

    def mean(rs, col, fmt):
        return fmt(statistics.fmean(r[col] for r in rs)) if rs[0][col] != "" else "-"

    lines = [
        "| arm | steps in 60 s | accuracy start -> final (mean +- sd) | best | KV saved | rejected seqs | masked tokens | mismatch KL |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        rs = [r for r in rows if r["arm"] == arm]
        if not rs:
            continue
        (sm, ssd), (fm, fsd) = msd([r["steps"] for r in rs]), msd([r["acc_final"] for r in rs])
        starts = "/".join(f"{x:.3f}" for x in sorted({r["acc_start"] for r in rs}))
        kv = "0" if arm == "dense" else mean(rs, "kv_saving", lambda v: f"{100 * v:.1f}%")
        lines.append(
            f"| {NAMES[arm]} | {sm:.0f} +- {ssd:.0f} | {starts} -> {fm:.3f} +- {fsd:.3f} | {statistics.fmean(r['acc_best'] for r in rs):.3f} | "
            f"{kv} | {mean(rs, 'rejected_frac', lambda v: f'{100 * v:.3f}%')} | {mean(rs, 'masked_frac', lambda v: f'{100 * v:.1f}%')} | "
            f"{mean(rs, 'mismatch_kl', lambda v: f'{v:.2f}')} |"
        )
    return lines


def report(runs: Path = RUNS, out: Path = OUT) -> list[dict]:
    rows, curves, found = [], [], []
    for arm in ARMS:
        for d in sorted(runs.glob(f"{arm}_s*")):
            if not (d / "metrics.jsonl").exists():
                continue
            row, curve = run_row(arm, int(d.name.rsplit("_s", 1)[1]), d)
            rows.append(row)
            curves += curve
            found.append(d)
    if not rows:
        fail(f"no finished runs under {runs} (run `python scripts/sparse_rl_toy.py run` first); {out} left as it was")
    out.mkdir(parents=True, exist_ok=True)
    for d in found:  # every row computed before the first file is written
        with atomic(out / f"{d.name}.metrics.jsonl", "wb") as f, (d / "metrics.jsonl").open("rb") as g:
            shutil.copyfileobj(g, f)
    for name, data in (("summary.csv", rows), ("accuracy_vs_time.csv", curves)):
        with atomic(out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(data[0]))
            w.writeheader()
            w.writerows(data)
    print("\n".join(table(rows)))
    return rows


def fail(msg: str) -> None:
    print(f"sparse_rl_toy.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["run", "report"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--runs", type=Path, default=RUNS)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    try:
        writable(args.out, "--out", directory=True)
    except ConfigError as e:
        fail(str(e))
    if args.what == "run":
        args.out.mkdir(parents=True, exist_ok=True)
        _long().run_jobs(jobs_for(args.seeds, args.runs), len(ARMS), args.out / "load.txt")
    report(args.runs, args.out)


if __name__ == "__main__":
    main()
