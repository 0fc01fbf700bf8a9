"""``make demo`` / ``make reproduce-figure-cpu``: the paper's CPU comparisons on the toy task with the tiny model.

    python -m pods.demo [--out results/demo] [OVERRIDES...]
    python -m pods.demo reproduce [--out results/cpu] [--seeds 1,...,10] [OVERRIDES...]
    python -m pods.demo summarize [--out results/cpu]
    python -m pods.demo per-step [--out results/cpu/pods_per_step] [--seeds 1,...,5] [OVERRIDES...]
    python -m pods.demo per-step-summarize [--out results/cpu/pods_per_step]

``demo``: the headline, GRPO-GA 64 (micro-batches of 16) against GRPO-PODS 64->16, seeds 0, 1, 2 each, and GRPO
16/16 with seed 0 as context; every run keeps its final weights (``final/``, so ``pods-eval`` runs on it).
``reproduce``: GRPO 16/16, GRPO-GA 64/16 and PODS 64->16 x 10 seeds. ``per-step``: GRPO 16/16 against PODS 64->16 x 5
seeds with a binary reward on operands the tiny model mostly fails (many zero-variance groups), compared by steps,
with a GPU cost model (L40S per-step costs applied to those curves; labelled a model). Runs go one at a time, seed by seed, into
``OUT/runs/<experiment>/seed<k>`` (log: ``launch.log`` there; the load before and after each run: ``OUT/load.txt``);
a run that finished is not run again (while its config.json is what the experiment file composes now; otherwise the
command stops in one line before any run), so the same command continues an interrupted reproduction.

Budgets are optimizer STEPS and evaluations come every so many steps, calibrated so that every arm gets the same
training seconds on an idle 2-core machine (the experiment files give the numbers): learning is then deterministic,
every machine reproduces the committed accuracies exactly, and only the seconds vary. ``pods.results`` reads the
runs' own metrics.jsonl and writes OUT/: the figure, the CSV of every evaluation and summary.txt (per arm: start,
peak, steps, s/step, generation/update time, zero-variance groups; per comparison the band speed-up per seed pair and
pooled, ``pods.results.speedup``, and the paper's 99%-of-peak speed-up, by seconds and by steps), with the load.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from pathlib import Path

from pods.errors import ConfigError
from pods.launch import Job, launch, machine_load, status
from pods.numerics import pin, summary_line
from pods.results.plot import plot_runs
from pods.results.report import eval_rows, speedup_report, write_csv
from pods.results.runs import load_run
from pods.results.speedup import BAND, band_line

GA, PODS, GRPO = "GRPO-GA 64/16", "PODS 64→16", "GRPO 16/16"
DEMO = {GA: ("demo_grpo_ga_cpu", (0, 1, 2)), PODS: ("demo_pods_cpu", (0, 1, 2)), GRPO: ("demo_grpo_cpu", (0,))}
SEEDED = {GRPO: "toy_grpo_16_16_cpu", GA: "toy_grpo_ga_64_16_cpu", PODS: "toy_pods_64_16_cpu"}
COMPARISONS = [(GA, PODS), (GRPO, PODS)]  # (baseline, arm)
PER_STEP = {GRPO: "toy_binary_grpo_16_16_cpu", PODS: "toy_binary_pods_64_16_cpu"}  # binary reward, operands in [50, 149]
CSV_FIELDS = ["label", "run_dir", "step", "train_time", "accuracy", "answer_prob", "n_eval"]
PAPER_L40S = (8.2, 10.2)  # s per step on one L40S: GRPO 16/16, PODS 64->16 (paper-facts.md)
IDLE_S_PER_STEP = {GRPO: 0.153, GA: 0.573, PODS: 0.306}  # the budgets' calibration: idle 2-core machine (docs/cpu-miniature.md)


def job(label: str, exp: str, seed: int, run_dir: Path, end: str, overrides: list[str]) -> Job | None:
    """A fresh run of ``exp`` with ``seed`` into ``run_dir``; None when a run there has finished (kept)."""
    args = [f"experiment={exp}", f"seed={seed}", f"train.checkpoint_at_end={end}", *overrides]
    if (status(run_dir) or {}).get("status") == "finished":
        changed = changed_keys(run_dir, args)
        if changed:
            raise ConfigError(
                f"{run_dir} finished with another config than `{' '.join(args)}` composes now ({', '.join(changed[:4])}); "
                "move or delete that run directory to run it again"
            )
        print(f"[demo] {label} seed {seed}: finished in {run_dir}, kept", flush=True)
        return None
    for stale in ("metrics.jsonl", "config.json"):
        (run_dir / stale).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # an unfinished demo run starts again: a fresh run's place is empty
    return Job(args, run_dir, log=run_dir / "launch.log", name=f"{label} seed {seed}")


def differences(kept, now, prefix: str = "") -> list[str]:
    """Dotted keys whose value in ``kept`` (a finished run's config.json) differs from ``now``; a key the kept record
    lacks is an option added since, whose default keeps the old behaviour (house rule), so it is not a difference."""
    if not isinstance(kept, dict) or not isinstance(now, dict):
        return [] if kept == now else [prefix.rstrip(".") or "(root)"]
    return [d for k, v in kept.items() if k in now for d in differences(v, now[k], f"{prefix}{k}.")]


def changed_keys(run_dir: Path, args: list[str]) -> list[str]:
    """What differs between the finished run in ``run_dir`` and the config ``args`` compose now (provenance aside)."""
    from pods.compose import compose

    kept = json.loads((run_dir / "config.json").read_text())
    kept.pop("provenance", None)
    return differences(kept, json.loads(json.dumps(compose(args, rules=False).model_dump())))


def run_all(out: Path, arms: dict[str, tuple[str, tuple[int, ...]]], end: str, overrides: list[str]) -> tuple[dict[str, list[Path]], int]:
    """Every arm x seed, one at a time, seed by seed (load changes spread over the arms alike); the load before and
    after each run appended to ``out/load.txt``. Every kept run is checked before the first run starts. Returns
    label -> run dirs, and how many runs ran now."""
    dirs: dict[str, list[Path]] = {label: [] for label in arms}
    todo: list[tuple[str, int, Job]] = []
    for k in sorted({k for _, ks in arms.values() for k in ks}):
        for label, (exp, ks) in arms.items():
            if k not in ks:
                continue
            run_dir = out / "runs" / exp / f"seed{k}"
            dirs[label].append(run_dir)
            j = job(label, exp, k, run_dir, end, overrides)
            if j is not None:
                todo.append((exp, k, j))
    for exp, k, j in todo:
        j.run_dir.mkdir(parents=True, exist_ok=True)
        before = machine_load()
        launch([j], "local", tag="demo")
        with (out / "load.txt").open("a") as f:
            f.write(f"{exp} seed {k}: {before} before, {machine_load()} after\n")
    return dirs, len(todo)


def summarize(dirs: dict[str, list[Path]], out: Path, title: str, header: list[str], n_boot: int = 2000, idle: bool = True) -> list[str]:
    """Figure, CSV and summary.txt from the runs' metrics.jsonl; returns the summary lines. ``idle``: add the
    comparisons on the idle-calibrated clock (the toy task's arms, whose budgets it calibrated)."""
    runs = {label: [load_run(d) for d in ds] for label, ds in dirs.items() if ds}
    png = plot_runs(runs, out / "accuracy_vs_time.png", title)
    rows = [{**e, "train_time": round(e["train_time"], 3), "n_eval": e["n_eval"] or 0} for e in eval_rows(runs, CSV_FIELDS)]
    for e in rows:
        e["answer_prob"] = "" if e["answer_prob"] is None else round(e["answer_prob"], 6)
    csv_path = write_csv(rows, out / "accuracy_vs_time.csv", CSV_FIELDS)
    lines = header + speedup_report(runs, COMPARISONS, n_boot=n_boot) + (idle_clock(runs) if idle else []) + caveat(runs)
    lines += [f"figure: {png}", f"csv:    {csv_path}"]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    return lines


def idle_clock(runs: dict) -> list[str]:
    """The comparisons on the idle-calibrated clock (steps x the calibration's idle s/step, a MODEL of an idle machine):
    under a changing load the measured seconds of runs made one after another are not comparable, steps are."""
    lines = []
    for baseline, arm in COMPARISONS:
        if baseline in runs and arm in runs:
            base = [(xs * IDLE_S_PER_STEP[baseline], ys) for xs, ys in (r.curve("step") for r in runs[baseline])]
            other = [(xs * IDLE_S_PER_STEP[arm], ys) for xs, ys in (r.curve("step") for r in runs[arm])]
            lines.append(band_line(f"{arm} vs {baseline}", "idle-calibrated seconds (steps x idle s/step: a model)", base, other))
    return lines


def caveat(runs: dict) -> list[str]:
    """Why PODS vs GRPO 16/16 by seconds cannot hold on a CPU, from the runs' own generation costs."""
    if GRPO not in runs or PODS not in runs:
        return []
    gen = [sum(r.costs["t_generate"] for r in runs[k]) / len(runs[k]) for k in (PODS, GRPO)]
    step = [sum(r.costs["s_per_step"] for r in runs[k]) / len(runs[k]) for k in (PODS, GRPO)]
    return [
        f"CPU caveat ({GRPO}, context): here generating 64 rollouts per prompt costs {gen[0] / gen[1]:.2f}x generating 16 and a "
        f"{PODS} step {step[0] / step[1]:.2f}x a {GRPO} step (these runs' medians); the paper's L40S: {PAPER_L40S[1]} s vs "
        f"{PAPER_L40S[0]} s per step ({PAPER_L40S[1] / PAPER_L40S[0]:.2f}x), so by seconds this comparison cannot favour PODS on "
        "this CPU (by steps it can)"
    ]


def cost_model(runs: dict, gpu_results: Path = Path("results/gpu")) -> list[str]:
    """A COST MODEL, not a measurement: the measured per-step curves of GRPO 16/16 and PODS 64->16 put on a GPU's
    clock, x = steps x s/step, with the paper's L40S costs and with each per-step ratio the GPU step-cost bench
    (``benchmarks/bench_gpu.py --step-cost``) wrote under ``gpu_results`` (``<gpu>/step_summary.csv``, the first row
    at n = 64: LoRA when it was measured); the band metric on those modelled curves."""
    if GRPO not in runs or PODS not in runs:
        return []
    costs = {f"paper's L40S {PAPER_L40S[0]} s / {PAPER_L40S[1]} s per step": PAPER_L40S}
    for path in sorted(gpu_results.glob("*/step_summary.csv")):
        rows = [r for r in csv.DictReader(path.open()) if r.get("n") == "64" and r.get("pods_over_grpo16")]
        if rows:
            what = f"{path.parent.name}" + (f" {rows[0]['finetune']}" if rows[0].get("finetune") else "")
            costs[f"step-cost bench {what}: PODS step {float(rows[0]['pods_over_grpo16']):.2f}x"] = (
                1.0,
                float(rows[0]["pods_over_grpo16"]),
            )
    lines = [
        f"GPU COST MODEL (not a measurement): the per-step curves above on a modelled clock; step-cost bench ratios found: {len(costs) - 1}"
    ]
    for name, (c_grpo, c_pods) in costs.items():
        base = [(xs * c_grpo, ys) for xs, ys in (r.curve("step") for r in runs[GRPO])]
        arm = [(xs * c_pods, ys) for xs, ys in (r.curve("step") for r in runs[PODS])]
        lines.append(f"  model, {name}: " + band_line(f"{PODS} vs {GRPO}", "modelled seconds", base, arm))
    return lines


def header_lines(command: str, t0: float, before: str, what: str) -> list[str]:
    return [
        f"{command}: {time.time() - t0:.0f} s wall-clock for {what}, one run at a time; {before} at the start, {machine_load()} at the end",
        "accuracy: sampled (T = 1) test accuracy; answer_prob: mean teacher-forced probability of the canonical answer (no "
        f"sampling noise); ± = 1.96 SE over seeds (one seed: over eval samples); band metric: {BAND.text()}, median over "
        "levels of t_baseline / t_arm on isotonic fits, [95% percentile bootstrap over seeds], given from 3 seeds per arm on; "
        "99% of peak: the paper's metric. Accuracies are the same on every machine; seconds are this machine's (see load.txt)",
        summary_line(),
    ]


def demo(out: Path, overrides: list[str]) -> None:
    t0, before = time.time(), machine_load()
    dirs, ran = run_all(out, DEMO, "weights", overrides)
    header = header_lines("make demo", t0, before, f"{GA} and {PODS} x 3 seeds, {GRPO} x 1 seed")
    old = out / "summary.txt"
    if not ran and old.exists() and old.read_text().startswith("make demo:"):
        header[0] = old.read_text().splitlines()[0]  # nothing ran now: the wall-clock of the run that made them
    for line in summarize(dirs, out, "toy arithmetic, tiny Qwen2, CPU: 3 seeds (GRPO 16/16: 1)", header):
        print("[demo]", line)


def seeded(out: Path, seeds: list[int], overrides: list[str], redraw: bool) -> None:
    """``reproduce`` (run what is not finished, then summarize) or ``summarize`` (redraw from the runs, keeping the
    header the reproduction wrote: its wall-clock and load)."""
    t0, before = time.time(), machine_load()
    if redraw:
        dirs = {label: sorted((out / "runs" / exp).glob("seed*"), key=lambda p: int(p.name[4:])) for label, exp in SEEDED.items()}
        old = out / "summary.txt"
        header = old.read_text().splitlines()[:3] if old.exists() else ["redrawn from the runs' metrics.jsonl"]
    else:
        dirs, _ = run_all(out, {label: (exp, tuple(seeds)) for label, exp in SEEDED.items()}, "false", overrides)
        header = header_lines(
            "make reproduce-figure-cpu", t0, before, f"{len(SEEDED)} arms x {len(seeds)} seeds (runs already finished kept)"
        )
    for line in summarize(dirs, out, "toy arithmetic, tiny Qwen2, CPU: mean ± 1.96 SE over seeds", header):
        print("[reproduce]", line)


def per_step(out: Path, seeds: list[int], overrides: list[str], redraw: bool, gpu_results: Path = Path("results/gpu")) -> None:
    """GRPO 16/16 against PODS 64->16 with a binary reward where most groups have zero reward variance, compared by
    optimizer steps (``PER_STEP``), and the GPU cost model on those curves; ``redraw``: from the runs alone."""
    t0, before = time.time(), machine_load()
    arms = {label: (exp, tuple(seeds)) for label, exp in PER_STEP.items()}
    if redraw:
        dirs = {label: sorted((out / "runs" / exp).glob("seed*"), key=lambda p: int(p.name[4:])) for label, exp in PER_STEP.items()}
        old = out / "summary.txt"
        header = old.read_text().splitlines()[:3] if old.exists() else ["redrawn from the runs' metrics.jsonl"]
    else:
        dirs, _ = run_all(out, arms, "false", overrides)
        header = header_lines("make reproduce-pods-per-step-cpu", t0, before, f"{len(arms)} arms x {len(seeds)} seeds (finished runs kept)")
    title = "binary reward, operands in [50, 149], tiny Qwen2, CPU: GRPO 16/16 vs PODS 64→16 (compare by steps)"
    lines = summarize(dirs, out, title, header, idle=False)
    runs = {label: [load_run(d) for d in ds] for label, ds in dirs.items() if ds}
    lines += cost_model(runs, gpu_results)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    for line in lines:
        print("[per-step]", line)


def main(argv: list[str] | None = None) -> None:
    pin()  # the CPU numerics, before anything loads torch (pods.numerics); the runs inherit them
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in ("reproduce", "summarize", "per-step", "per-step-summarize") else "demo"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out = {"demo": "results/demo", "per-step": "results/cpu/pods_per_step", "per-step-summarize": "results/cpu/pods_per_step"}
    p.add_argument("--out", default=out.get(mode, "results/cpu"), help="output directory")
    seeds = "1,2,3,4,5" if mode.startswith("per-step") else ",".join(map(str, range(1, 11)))
    p.add_argument("--seeds", default=seeds, help="reproduce, per-step: comma-separated seeds")
    p.add_argument("--gpu-results", default="results/gpu", help="per-step: where the cost model finds <gpu>/step_summary.csv")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm, e.g. train.max_steps=20")
    args = p.parse_args(argv)
    try:
        if mode == "demo":
            demo(Path(args.out), args.overrides)
        elif mode.startswith("per-step"):
            seeds, redraw = [int(k) for k in args.seeds.split(",")], mode == "per-step-summarize"
            per_step(Path(args.out), seeds, args.overrides, redraw, Path(args.gpu_results))
        else:
            seeded(Path(args.out), [int(k) for k in args.seeds.split(",")], args.overrides, redraw=mode == "summarize")
    except ConfigError as e:
        print(f"pods.demo: {e}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
