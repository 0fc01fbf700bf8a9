"""``make demo`` / ``make reproduce-figure-cpu``: GRPO 16/16, GRPO-GA 64 (micro-batches of 16) and GRPO-PODS 64->16
on the toy task, CPU: one seed each (demo) or several seeds (reproduce).

    python -m pods.demo [--out results/demo] [OVERRIDES...]
    python -m pods.demo reproduce [--out results/cpu] [--seeds 1,2,3,4,5] [--jobs 2] [OVERRIDES...]
    python -m pods.demo summarize [--out results/cpu]

Each arm runs ``python -m pods.train experiment=demo_<arm>_cpu`` (through ``pods.launch``) for the optimizer-step
budget of its experiment file (steps, not seconds: the comparison stays fair when other processes share the
machine), then ``pods.results`` reads the runs' own metrics.jsonl and writes results/demo/: the figure (test
accuracy vs training seconds and vs steps, with the 1.96-SE eval noise band), the CSV of every eval, and
summary.txt (the printed table: start, peak, steps, s/step, generation/update time, zero-variance groups, and both
comparisons' speed-ups to 99% of the baseline's peak, by seconds and by steps), with the machine's load.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pods.launch import Job, launch, machine_load
from pods.numerics import pin, summary_line
from pods.results.plot import plot_runs
from pods.results.report import eval_rows, speedup_report, write_csv
from pods.results.runs import load_run

ARMS = {"GRPO 16/16": "demo_grpo_cpu", "GRPO-GA 64/16": "demo_grpo_ga_cpu", "PODS 64→16": "demo_pods_cpu"}
SEEDED = {"GRPO 16/16": "toy_grpo_16_16_cpu", "GRPO-GA 64/16": "toy_grpo_ga_64_16_cpu", "PODS 64→16": "toy_pods_64_16_cpu"}
COMPARISONS = [("GRPO-GA 64/16", "PODS 64→16"), ("GRPO 16/16", "PODS 64→16")]  # (baseline, arm)
CSV_FIELDS = ["label", "run_dir", "step", "train_time", "accuracy", "n_eval"]


def fresh_job(label: str, exp: str, run_dir: Path, overrides: list[str], seed: int | None = None, log: Path | None = None) -> Job:
    """A fresh run of ``exp`` into ``run_dir`` (an earlier run's metrics and config there are deleted)."""
    for stale in ("metrics.jsonl", "config.json"):
        (run_dir / stale).unlink(missing_ok=True)
    seeded = [f"seed={seed}"] if seed is not None else []
    name = f"{label} seed {seed}" if seed is not None else label
    return Job([f"experiment={exp}", *seeded, "train.checkpoint_at_end=false", *overrides], run_dir, log=log, name=name)


def run_arms(out: Path, overrides: list[str]) -> dict[str, Path]:
    """Each demo arm into ``out/runs/<experiment>``, one after another; returns label -> run dir."""
    dirs = {label: out / "runs" / exp for label, exp in ARMS.items()}
    launch([fresh_job(label, ARMS[label], d, overrides) for label, d in dirs.items()], "local", tag="demo")
    return dirs


def reproduce(out: Path, seeds: list[int], jobs: int, overrides: list[str]) -> dict[str, list[Path]]:
    """Every arm x seed into ``out/runs/<experiment>/seed<k>``, ``jobs`` runs at a time (1 torch thread each),
    ordered seed by seed so that changes in the machine's load spread over all arms alike."""
    (out / "runs").mkdir(parents=True, exist_ok=True)
    dirs: dict[str, list[Path]] = {label: [] for label in SEEDED}
    queue = []
    for k in seeds:
        for label, exp in SEEDED.items():
            dirs[label].append(out / "runs" / exp / f"seed{k}")
            log = out / "runs" / f"{exp}_seed{k}.log" if jobs > 1 else None
            queue.append(fresh_job(label, exp, dirs[label][-1], overrides, seed=k, log=log))
    launch(queue, "local", parallel=jobs, tag="reproduce")
    return dirs


def summarize(dirs: dict[str, Path | list[Path]], out: Path, title: str, header: list[str], n_boot: int = 2000) -> list[str]:
    """Figure, CSV and summary.txt from the runs' metrics.jsonl; returns the summary lines."""
    runs = {label: [load_run(x) for x in ([d] if isinstance(d, (str, Path)) else d)] for label, d in dirs.items()}
    png = plot_runs(runs, out / "accuracy_vs_time.png", title)
    rows = [{**e, "train_time": round(e["train_time"], 3), "n_eval": e["n_eval"] or 0} for e in eval_rows(runs, CSV_FIELDS)]
    csv_path = write_csv(rows, out / "accuracy_vs_time.csv", CSV_FIELDS)
    lines = header + speedup_report(runs, COMPARISONS, n_boot=n_boot) + [f"figure: {png}", f"csv:    {csv_path}"]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    return lines


def demo(out: Path, overrides: list[str]) -> None:
    t0, before = time.time(), machine_load()
    dirs = run_arms(out, overrides)
    header = [
        f"make demo: {time.time() - t0:.0f} s wall-clock for {len(ARMS)} arms, one seed each; {before} at the start, {machine_load()} at the end",
        "accuracy: sampled (T = 1) test accuracy; ± = 1.96 SE over eval samples (binomial); speed-ups are to 99% of the baseline's peak",
        summary_line(),
    ]
    for line in summarize(dirs, out, "toy arithmetic, tiny Qwen2, CPU (1 seed per arm)", header):
        print("[demo]", line)


def seeded(out: Path, seeds: list[int], jobs: int, overrides: list[str], redraw: bool) -> None:
    """``reproduce`` (run, then summarize) or ``summarize`` (redraw from the runs, keeping the header the
    reproduction wrote: its wall-clock and load)."""
    t0, before = time.time(), machine_load()
    if redraw:
        dirs = {label: sorted((out / "runs" / exp).glob("seed*")) for label, exp in SEEDED.items()}
        old = out / "summary.txt"
        kept = old.read_text().splitlines() if old.exists() else ["redrawn from the runs' metrics.jsonl", ""]
        header = kept[:2] + [x for x in kept[2:4] if x.startswith("numerics:")]  # the reproduction's wall-clock, load, numerics
    else:
        dirs = reproduce(out, seeds, jobs, overrides)
        header = [
            f"make reproduce-figure-cpu: {time.time() - t0:.0f} s wall-clock, {len(SEEDED)} arms x {len(seeds)} seeds, "
            f"{jobs} runs at a time; {before} at the start, {machine_load()} at the end",
            "accuracy: sampled (T = 1) test accuracy, mean over seeds, ± = 1.96 SE over seeds; speed-ups are to 99% of the "
            "baseline's best mean accuracy, [95% percentile bootstrap over seeds]",
            summary_line(),
        ]
    for line in summarize(dirs, out, "toy arithmetic, tiny Qwen2, CPU: mean ± 1.96 SE over seeds", header):
        print("[reproduce]", line)


def main(argv: list[str] | None = None) -> None:
    pin()  # the CPU numerics, before anything loads torch (pods.numerics); the runs inherit them
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in ("reproduce", "summarize") else "demo"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/cpu" if mode != "demo" else "results/demo", help="output directory")
    p.add_argument("--seeds", default="1,2,3,4,5", help="reproduce: comma-separated seeds")
    p.add_argument("--jobs", type=int, default=2, help="reproduce: runs at a time (1 torch thread each)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm, e.g. train.max_steps=20")
    args = p.parse_args(argv)
    if mode == "demo":
        demo(Path(args.out), args.overrides)
    else:
        seeded(Path(args.out), [int(k) for k in args.seeds.split(",")], args.jobs, args.overrides, redraw=mode == "summarize")


if __name__ == "__main__":
    main()
