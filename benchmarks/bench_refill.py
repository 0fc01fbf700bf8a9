"""Refill rates of dynamic sampling on a task with many zero-variance groups (pre-registered in docs/knobs.md).

``python benchmarks/bench_refill.py [--setting toy|hard] [--run-dir DIR]``: trains the tiny model on the toy task
with a binary reward (``dataset.recipe=correctness``), grpo_pods n=8 m=4, 4 prompts per step,
``train.group_filter=nonzero_std train.refill_batches=3``, seed 0, through ``python -m pods.train``: ``toy`` the tiny
model's own range of numbers (20 steps), ``hard`` sums of 3-digit numbers, which it rarely gets right (10 steps), ``mid`` 50-199 (10 steps).
A run directory that already holds its train rows is read, not re-run. Then replaces the setting's row of ``results/bench/refill_rates.csv``: the fraction of generated groups
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
PROMPTS, N, M, K = 4, 8, 4, 3
SETTINGS = {  # name: (steps, extra overrides, the CSV's description)
    "toy": (20, [], "toy 10-99 (the tiny model's range), binary reward"),
    "hard": (10, ["dataset.low=100", "dataset.high=999"], "toy 100-999 (a harder range), binary reward"),
    "mid": (10, ["dataset.low=50", "dataset.high=199"], "toy 50-199 (half in the model's range), binary reward"),
}
ARGS = [
    "dataset.recipe=correctness",
    "algorithm=grpo_pods",
    f"algorithm.n={N}",
    f"algorithm.m={M}",
    f"train.prompts_per_step={PROMPTS}",
    "train.group_filter=nonzero_std",
    f"train.refill_batches={K}",
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
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="toy")
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/bench_refill_<setting>")
    args = ap.parse_args()
    steps, extra, what = SETTINGS[args.setting]
    run_dir = args.run_dir or ROOT / "runs" / f"bench_refill_{args.setting}"
    if len(rows_of(run_dir)) < steps:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "pods.train", *ARGS, *extra, f"train.max_steps={steps}", f"hydra.run.dir={run_dir}"]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    row = {"setting": args.setting, "what": f"{what}, grpo_pods n={N} m={M}, {PROMPTS} prompts, refill_batches={K}, seed 0"}
    row.update(summary(rows_of(run_dir)), load_1m=round(os.getloadavg()[0], 2))
    old = list(csv.DictReader(OUT.open())) if OUT.exists() else []
    rows = [r for r in old if r["setting"] != args.setting] + [row]  # one row per setting, this one replaced
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerows(sorted(rows, key=lambda r: list(SETTINGS).index(r["setting"])))
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
