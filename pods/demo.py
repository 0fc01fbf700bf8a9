"""``make demo``: GRPO 16/16, GRPO-GA 64 (micro-batches of 16) and GRPO-PODS 64->16 on the toy task, CPU, one seed each.

Each arm runs ``python -m pods.train experiment=demo_<arm>_cpu`` for the optimizer-step budget of its
experiment file (steps, not seconds: the comparison stays fair when other processes share the machine), then
``pods.analysis`` reads the runs' own metrics.jsonl and writes results/demo/: the figure (test accuracy vs
training seconds and vs steps, with the 1.96-SE eval noise band), the CSV of every eval, and summary.txt (the
printed table: start, peak, steps, s/step, generation/update time, zero-variance groups, and both
comparisons' speed-ups to 99% of the baseline's peak, by seconds and by steps), with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from pods.analysis import load_run, plot_runs, report, write_evals

ARMS = {"GRPO 16/16": "demo_grpo_cpu", "GRPO-GA 64/16": "demo_grpo_ga_cpu", "PODS 64→16": "demo_pods_cpu"}
COMPARISONS = [("GRPO-GA 64/16", "PODS 64→16"), ("GRPO 16/16", "PODS 64→16")]  # (baseline, arm)


def load() -> str:
    """The 1/5/15-minute load averages and the core count, for every timing written."""
    return f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores"


def run_arms(arms: dict[str, str], out: Path, overrides: list[str]) -> dict[str, Path]:
    """Run each arm's experiment into ``out/runs/<experiment>`` (a fresh run each time); returns label -> run dir."""
    dirs = {}
    for label, exp in arms.items():
        run_dir = out / "runs" / exp
        for stale in ("metrics.jsonl", "config.json"):
            (run_dir / stale).unlink(missing_ok=True)
        print(f"[demo] {label}: python -m pods.train experiment={exp} ({load()})", flush=True)
        cmd = [sys.executable, "-m", "pods.train", f"experiment={exp}", f"hydra.run.dir={run_dir}", "train.checkpoint_at_end=false", *overrides]
        subprocess.run(cmd, check=True)
        dirs[label] = run_dir
    return dirs


def summarize(dirs: dict[str, Path], out: Path, title: str, header: list[str], n_boot: int = 2000) -> list[str]:
    """Figure, CSV and summary.txt from the runs' metrics.jsonl; returns the summary lines."""
    runs = {label: [load_run(d)] if isinstance(d, (str, Path)) else [load_run(x) for x in d] for label, d in dirs.items()}
    png = plot_runs(runs, out / "accuracy_vs_time.png", title)
    csv_path = write_evals(runs, out / "accuracy_vs_time.csv")
    lines = header + report(runs, COMPARISONS, n_boot=n_boot) + [f"figure: {png}", f"csv:    {csv_path}"]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/demo", help="output directory")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm, e.g. train.max_steps=20")
    args = p.parse_args(argv)
    out = Path(args.out)
    t0, before = time.time(), load()
    dirs = run_arms(ARMS, out, args.overrides)
    header = [f"make demo: {time.time() - t0:.0f} s wall-clock for {len(ARMS)} arms, one seed each; {before} at the start, {load()} at the end",
              "accuracy: sampled (T = 1) test accuracy; ± = 1.96 SE over eval samples (binomial); speed-ups are to 99% of the baseline's peak"]
    for line in summarize(dirs, out, "toy arithmetic, tiny Qwen2, CPU (1 seed per arm)", header):
        print("[demo]", line)


if __name__ == "__main__":
    main()
