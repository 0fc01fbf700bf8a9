"""Refill rates of dynamic sampling on a task with many zero-variance groups (pre-registered in docs/knobs.md).

``python benchmarks/bench_refill.py [--run-dir DIR]``: trains the tiny model on the toy task with a binary reward
(``dataset.recipe=correctness``), grpo_pods n=8 m=4, 4 prompts per step, ``train.group_filter=nonzero_std
train.refill_batches=3``, 20 steps, seed 0, through ``python -m pods.train`` (a run directory that already holds
20 train rows is read, not re-run), then writes ``results/bench/refill_rates.csv``: the fraction of generated groups
filtered, the mean prompt batches generated per step, the fraction of steps that trained every group, the fraction
of trained groups that came from refills, and the share of the training clock spent generating. Counts, not
timings: the machine's load does not change them (the seconds columns are for orientation only).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "bench" / "refill_rates.csv"
PROMPTS, N, M, STEPS, K = 4, 8, 4, 20, 3
ARGS = [
    "dataset.recipe=correctness",
    "algorithm=grpo_pods",
    f"algorithm.n={N}",
    f"algorithm.m={M}",
    f"train.prompts_per_step={PROMPTS}",
    "train.group_filter=nonzero_std",
    f"train.refill_batches={K}",
    f"train.max_steps={STEPS}",
    "train.time_budget_s=null",
    "train.checkpoint_at_end=false",
    "eval.max_examples=16",
    "eval.repeats=1",
    "eval.every_s=null",
    "seed=0",
]


def rows_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "train"] if path.exists() else []


def summary(rows: list[dict]) -> dict:
    gen = sum(r["gen_batches"] for r in rows)
    trained = sum(r["kept"] // M for r in rows)
    return {
        "steps": len(rows),
        "groups_generated": PROMPTS * gen,
        "filtered_fraction": round(sum(r["groups_filtered"] for r in rows) / (PROMPTS * gen), 4),
        "steps_needing_refill": sum(r["gen_batches"] > 1 for r in rows),
        "mean_gen_batches": round(gen / len(rows), 4),
        "full_steps_fraction": round(sum(r["kept"] == PROMPTS * M for r in rows) / len(rows), 4),
        "refilled_fraction_of_trained": round(sum(r["groups_refilled"] for r in rows) / max(trained, 1), 4),
        "generate_share_of_clock": round(sum(r["t_generate"] for r in rows) / rows[-1]["train_time"], 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "bench_refill")
    args = ap.parse_args()
    if len(rows_of(args.run_dir)) < STEPS:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "pods.train", *ARGS, f"hydra.run.dir={args.run_dir}"]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    row = {"setting": f"toy binary, grpo_pods n={N} m={M}, {PROMPTS} prompts, refill_batches={K}, seed 0", **summary(rows_of(args.run_dir))}
    row["load_1m"] = round(os.getloadavg()[0], 2)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
