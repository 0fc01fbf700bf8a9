"""``make demo``: GRPO (n = m = 16) vs GRPO-PODS (n = 64 -> m = 16, max-variance) on the toy task, CPU.

Each arm runs ``python -m pods.train experiment=demo_<arm>_cpu`` for a fixed training-time budget (see the
experiment files), then the figure and CSV of eval accuracy vs training wall-clock are built from the
runs' own metrics.jsonl files into results/demo/.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from pods.plot import eval_rows, plot_accuracy_vs_time, write_csv

ARMS = {"GRPO 16/16": "demo_grpo_cpu", "GRPO-PODS 64->16": "demo_pods_cpu"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/demo", help="output directory")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm, e.g. train.time_budget_s=30")
    args = p.parse_args(argv)
    out = Path(args.out)
    runs = {}
    t0 = time.time()
    for label, exp in ARMS.items():
        run_dir = out / "runs" / exp
        if (run_dir / "metrics.jsonl").exists():
            (run_dir / "metrics.jsonl").unlink()  # a fresh curve each demo
        print(f"[demo] {label}: python -m pods.train experiment={exp}", flush=True)
        cmd = [sys.executable, "-m", "pods.train", f"experiment={exp}", f"hydra.run.dir={run_dir}", *args.overrides]
        subprocess.run(cmd, check=True)
        runs[label] = [run_dir]
    rows = eval_rows(runs)
    csv_path = write_csv(rows, out / "accuracy_vs_time.csv")
    png = plot_accuracy_vs_time(rows, out / "accuracy_vs_time.png", "toy arithmetic, tiny Qwen2, CPU")
    print(f"[demo] done in {time.time() - t0:.0f} s")
    for label in ARMS:
        r = [x for x in rows if x["label"] == label]
        print(f"[demo] {label}: accuracy {r[0]['accuracy']:.3f} at start -> {r[-1]['accuracy']:.3f} after {r[-1]['train_time']:.0f} s of training")
    print(f"[demo] figure: {png}\n[demo] csv:    {csv_path}")


if __name__ == "__main__":
    main()
