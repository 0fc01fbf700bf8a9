"""``make demo`` / ``make reproduce-figure-cpu``: GRPO 16/16, GRPO-GA 64 (micro-batches of 16) and GRPO-PODS 64->16
on the toy task, CPU: one seed each (demo) or several seeds (reproduce).

    python -m pods.demo [--out results/demo] [OVERRIDES...]
    python -m pods.demo reproduce [--out results/cpu] [--seeds 1,2,3,4,5] [--jobs 2] [OVERRIDES...]
    python -m pods.demo summarize [--out results/cpu]

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
SEEDED = {"GRPO 16/16": "toy_grpo_16_16_cpu", "GRPO-GA 64/16": "toy_grpo_ga_64_16_cpu", "PODS 64→16": "toy_pods_64_16_cpu"}
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
        cmd = [
            sys.executable,
            "-m",
            "pods.train",
            f"experiment={exp}",
            f"hydra.run.dir={run_dir}",
            "train.checkpoint_at_end=false",
            *overrides,
        ]
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


def reproduce(out: Path, seeds: list[int], jobs: int, overrides: list[str]) -> dict[str, list[Path]]:
    """Every arm x seed into ``out/runs/<experiment>/seed<k>``, ``jobs`` runs at a time (1 torch thread each),
    ordered seed by seed so that changes in the machine's load spread over all arms alike."""
    queue = [(label, exp, k) for k in seeds for label, exp in SEEDED.items()]
    dirs: dict[str, list[Path]] = {label: [] for label in SEEDED}
    running: list[subprocess.Popen] = []
    for label, exp, k in queue:
        run_dir = out / "runs" / exp / f"seed{k}"
        for stale in ("metrics.jsonl", "config.json"):
            (run_dir / stale).unlink(missing_ok=True)
        while len(running) >= jobs:
            running = [p for p in running if _alive(p)]
            time.sleep(0.5)
        print(f"[reproduce] {label} seed {k} ({load()})", flush=True)
        cmd = [
            sys.executable,
            "-m",
            "pods.train",
            f"experiment={exp}",
            f"seed={k}",
            f"hydra.run.dir={run_dir}",
            "train.checkpoint_at_end=false",
            *overrides,
        ]
        log = (out / "runs" / f"{exp}_seed{k}.log").open("w") if jobs > 1 else None
        running.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT if log else None))
        dirs[label].append(run_dir)
    for p in running:
        _alive(p, wait=True)
    return dirs


def _alive(p: subprocess.Popen, wait: bool = False) -> bool:
    rc = p.wait() if wait else p.poll()
    if rc not in (None, 0):
        raise SystemExit(f"[reproduce] a run failed (exit {rc}): {' '.join(p.args)}")
    return rc is None


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in ("reproduce", "summarize") else "demo"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/cpu" if mode != "demo" else "results/demo", help="output directory")
    p.add_argument("--seeds", default="1,2,3,4,5", help="reproduce: comma-separated seeds")
    p.add_argument("--jobs", type=int, default=2, help="reproduce: runs at a time (1 torch thread each)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm, e.g. train.max_steps=20")
    args = p.parse_args(argv)
    out = Path(args.out)
    if mode != "demo":
        seeds = [int(k) for k in args.seeds.split(",")]
        t0, before = time.time(), load()
        if mode == "reproduce":
            (out / "runs").mkdir(parents=True, exist_ok=True)
            dirs = reproduce(out, seeds, args.jobs, args.overrides)
        else:  # redraw: keep the header (wall-clock, load) the reproduction wrote
            dirs = {label: sorted((out / "runs" / exp).glob("seed*")) for label, exp in SEEDED.items()}
            old = out / "summary.txt"
            before = old.read_text().splitlines()[:2] if old.exists() else ["redrawn from the runs' metrics.jsonl", ""]
        header = (
            before
            if mode == "summarize"
            else [
                f"make reproduce-figure-cpu: {time.time() - t0:.0f} s wall-clock, {len(SEEDED)} arms x {len(next(iter(dirs.values())))} seeds, "
                f"{args.jobs} runs at a time; {before} at the start, {load()} at the end",
                "accuracy: sampled (T = 1) test accuracy, mean over seeds, ± = 1.96 SE over seeds; speed-ups are to 99% of the "
                "baseline's best mean accuracy, [95% percentile bootstrap over seeds]",
            ]
        )
        for line in summarize(dirs, out, "toy arithmetic, tiny Qwen2, CPU: mean ± 1.96 SE over seeds", header):
            print("[reproduce]", line)
        return
    t0, before = time.time(), load()
    dirs = run_arms(ARMS, out, args.overrides)
    header = [
        f"make demo: {time.time() - t0:.0f} s wall-clock for {len(ARMS)} arms, one seed each; {before} at the start, {load()} at the end",
        "accuracy: sampled (T = 1) test accuracy; ± = 1.96 SE over eval samples (binomial); speed-ups are to 99% of the baseline's peak",
    ]
    for line in summarize(dirs, out, "toy arithmetic, tiny Qwen2, CPU (1 seed per arm)", header):
        print("[demo]", line)


if __name__ == "__main__":
    main()
