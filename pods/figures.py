"""The paper's figures: which experiments and sweep make each one, how to launch them, how to draw them.

    python -m pods.figures reproduce NAME [HYDRA OVERRIDES...] [--launcher slurm|local] [--runs DIR] [--seeds 1,2]
    python -m pods.figures plot NAME [--runs DIR] [--out DIR] [--reference DIR]
    python -m pods.figures list

``reproduce`` runs every experiment of the figure over its sweep (``conf/sweep``) through ``pods.launch``: one
directory per resolved config under ``RUNS/../by-config`` (``RUNS`` defaults to runs/paper/NAME), shared with the
other figures that contain the same run, and the figure's list in ``RUNS/runs.json``. Single-GPU figures run as
Hydra multiruns (``slurm``: one SLURM job array per run, submitted together; ``local``: one run after another
here), 8-GPU figures as one ``slurm/run_8gpu.sbatch`` job per seed (``local``: torchrun, one run after another).
Every run has ``train.resume=auto``, so re-running continues unfinished runs. ``plot`` reads the runs through
``pods.results``, labels them by their algorithm settings, and draws mean +- 1.96 standard errors across seeds on
a common time grid, with the authors' released curves (``--reference``, ../shared/reference) dashed in the same
colours.
"""

from __future__ import annotations

import argparse
import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pods import launch
from pods.results.curves import mean_curves
from pods.results.plot import plot_curves
from pods.results.report import EVAL_FIELDS, eval_rows, figure_bands, figure_summary, table, write_csv, write_curves
from pods.results.runs import Run, arm, by_rule, find_runs, group, load_run, record
from pods.results.speedup import BAND, Band


def single_gpu_reference(train_set: str, model: str, keep: Callable[[dict], bool]) -> Callable[[Path], list[dict]]:
    """The authors' single-GPU checkpoints (every 30 min; Llama every 10 min) on the test set: answer accuracy
    (``ans_acc``) as ``accuracy`` and right-AND-formatted (``both_acc``) as ``both_accuracy``."""

    def load(ref: Path) -> list[dict]:
        every = 600 if model.startswith("Llama") else 1800
        eval_set = {"gsm8k": "gsm8k", "math": "math500"}[train_set]
        out = []
        with (ref / "pods_single_gpu_curves.csv").open() as f:
            for r in csv.DictReader(f):
                if (r["train_set"], r["model"], r["eval_set"]) != (train_set, model, eval_set):
                    continue
                n, m = int(r["n"]), int(r["m"])
                a = {"rule": r["rule"] if n != m else "all", "n": n, "m": m, "grad_accum": False}
                if keep(a):
                    out.append(
                        {
                            "alg": a,
                            "run_dir": r["run_name"],
                            "train_time": int(r["checkpoint_index"]) * every,
                            "accuracy": float(r["ans_acc"]),
                            "both_accuracy": float(r["both_acc"]),
                        }
                    )
        return out

    return load


def multi_gpu_reference(filename: str) -> Callable[[Path], list[dict]]:
    """The authors' W&B export of the 8-GPU runs: eval/time (s) vs accuracy, run names ...-s<seed>-p8-n<n>-m<m>-ga<ga>."""

    def load(ref: Path) -> list[dict]:
        out = []
        with (ref / filename).open() as f:
            for r in csv.DictReader(f):
                for col, v in r.items():
                    hit = re.search(r"data/(\S+-s\d+-p\d+-n(\d+)-m(\d+)-ga\d+) - eval/rewards/accuracy_reward/mean$", col)
                    if hit and v:
                        n, m = int(hit.group(2)), int(hit.group(3))
                        a = {"rule": "all" if n == m else "max_variance", "n": n, "m": m, "grad_accum": n == m}
                        out.append({"alg": a, "run_dir": hit.group(1), "train_time": float(r["eval/time"]), "accuracy": float(v)})
        return out

    return load


@dataclass(frozen=True)
class Figure:
    title: str
    experiments: tuple[str, ...]
    sweep: str
    label: Callable[[dict], str] = arm
    gpus: int = 1  # 1: Hydra multirun; 8: one slurm/run_8gpu.sbatch job (or torchrun) per seed
    hydra_launcher: str = "slurm"  # the Hydra launcher config of one-GPU runs on SLURM (conf/hydra/launcher)
    reference: Callable[[Path], list[dict]] | None = None
    baseline: str | None = None  # the label whose best mean accuracy sets the speed-up target
    time_unit: str = "h"
    metric: str = "accuracy"  # the eval metric plotted: accuracy | both_accuracy (answer AND format, the Llama panel)
    band: Band = BAND  # the band speed-up's levels (pods.results.speedup), fixed here before any run


QWEN3B_GSM8K_PODS = "gsm8k_qwen3b_pods_64_16_l40s"
FIGURES = {
    "3-gsm8k-qwen3b-l40s": Figure(
        "GSM8K, Qwen2.5-3B-Instruct, 1x L40S (LoRA)",
        ("gsm8k_qwen3b_grpo_16_16_l40s", QWEN3B_GSM8K_PODS),
        "seeds_single_gpu",
        reference=single_gpu_reference(
            "gsm8k", "Qwen2.5-3B-Instruct", lambda a: (a["n"], a["m"], a["rule"]) in {(16, 16, "all"), (64, 16, "max_variance")}
        ),
        baseline="GRPO 16/16",
    ),
    "3-math-qwen3b-l40s": Figure(
        "MATH, Qwen2.5-3B-Instruct, 1x L40S (LoRA), MATH-500",
        ("math_qwen3b_grpo_8_8_l40s", "math_qwen3b_pods_32_8_l40s"),
        "seeds_single_gpu",
        reference=single_gpu_reference("math", "Qwen2.5-3B-Instruct", lambda a: True),
        baseline="GRPO 8/8",
    ),
    "3-gsm8k-llama3b-l40s": Figure(
        "GSM8K, Llama-3.2-3B-Instruct, 1x L40S (LoRA, beta 0.04)",
        ("gsm8k_llama3b_grpo_16_16_l40s", "gsm8k_llama3b_pods_64_16_l40s"),
        "seeds_single_gpu",
        reference=single_gpu_reference("gsm8k", "Llama-3.2-3B-Instruct", lambda a: True),
        baseline="GRPO 16/16",
        metric="both_accuracy",
    ),
    "3-gsm8k-qwen3b-h100x8": Figure(
        "GSM8K, Qwen2.5-3B-Instruct, 8x H100 (full FT)",
        ("gsm8k_qwen3b_grpo_ga_h100x8", "gsm8k_qwen3b_pods_h100x8"),
        "seeds_multi_gpu",
        gpus=8,
        reference=multi_gpu_reference("pods_h100x8_wandb_acc.csv"),
        baseline="GRPO-GA 32/32",
        time_unit="min",
    ),
    "3-gsm8k-qwen7b-a100x8": Figure(
        "GSM8K, Qwen2.5-7B-Instruct, 8x A100 (full FT)",
        ("gsm8k_qwen7b_grpo_ga_a100x8", "gsm8k_qwen7b_pods_a100x8"),
        "seeds_multi_gpu",
        gpus=8,
        reference=multi_gpu_reference("pods_a100x8_wandb_acc.csv"),
        baseline="GRPO-GA 32/32",
        time_unit="min",
    ),
    "4-n": Figure(
        "GSM8K, Qwen2.5-3B, 1x L40S: PODS max-variance, m = 16, n swept",
        (QWEN3B_GSM8K_PODS,),
        "n_sweep",
        reference=single_gpu_reference("gsm8k", "Qwen2.5-3B-Instruct", lambda a: a["m"] == 16 and a["rule"] in ("all", "max_variance")),
    ),
    "4-m": Figure(
        "GSM8K, Qwen2.5-3B, 1x L40S: PODS max-variance, n = 64, m swept",
        (QWEN3B_GSM8K_PODS,),
        "m_sweep",
        reference=single_gpu_reference("gsm8k", "Qwen2.5-3B-Instruct", lambda a: a["n"] == 64 and a["rule"] == "max_variance"),
    ),
    "5": Figure(
        "GSM8K, Qwen2.5-3B, 1x L40S: down-sampling rule at n = 64 -> m = 16",
        (QWEN3B_GSM8K_PODS,),
        "rules",
        label=by_rule,
        reference=single_gpu_reference("gsm8k", "Qwen2.5-3B-Instruct", lambda a: (a["n"], a["m"]) == (64, 16)),
    ),
    "gpu-quickstart": Figure(  # not a paper figure: the one-GPU quickstart (make gpu-quickstart, seed 1, run here)
        "GSM8K, Qwen2.5-0.5B-Instruct, 1x H100 (full FT): GRPO-GA 64/16 vs PODS 64->16",
        ("gsm8k_qwen0_5b_grpo_ga_1gpu", "gsm8k_qwen0_5b_pods_1gpu"),
        "seeds_single_gpu",
        baseline="GRPO-GA 64/16",
        time_unit="min",
    ),
    "cpu": Figure(
        "toy arithmetic, tiny Qwen2, CPU: GRPO vs GRPO-GA vs GRPO-PODS",
        ("toy_grpo_16_16_cpu", "toy_grpo_ga_64_16_cpu", "toy_pods_64_16_cpu"),
        "seeds_cpu",
        baseline="GRPO 16/16",
        time_unit="s",
        hydra_launcher="slurm_cpu",
    ),
}
GROUPS = {"3": [k for k in FIGURES if k.startswith("3-")], "4": ["4-n", "4-m"]}


def sweep_jobs(exp: str, sweep: str, overrides: list[str] = ()) -> tuple[list[list[str]], dict]:
    """The jobs Hydra's basic sweeper would launch for ``experiment=exp +sweep=sweep``, and the resolved run config."""
    from pods.compose import compose_job, expand, hydra_context, job_dict

    with hydra_context():
        cfg = compose_job([f"experiment={exp}", f"+sweep={sweep}"])
        task = job_dict(cfg)
    params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()] + list(overrides)
    return expand(params), task


def resolved(exp: str, overrides: list[str]) -> dict:
    """The resolved run config of ``experiment=exp`` with ``overrides`` (what pods.train would run)."""
    from pods.compose import compose_plain

    return compose_plain([f"experiment={exp}", *overrides])


def reproduce(name: str, launcher: str, runs: Path, seeds: str | None, extra: list[str]) -> list:
    """Launch the figure's runs that no figure has launched yet (``pods.launch.run_key``: one directory per resolved
    config under ``runs/../by-config``); list all of them in ``runs/runs.json``. With SLURM, returns the
    submitting processes (``pods.launch.wait``)."""
    fig, store = FIGURES[name], runs.parent / "by-config"
    jobs: dict[Path, launch.Job] = {}
    for exp in fig.experiments:
        sweep, cfg = sweep_jobs(exp, fig.sweep, [f"seed={seeds}"] if seeds else [])
        for job in sweep:
            args = [f"experiment={exp}", *job, *extra]
            run_dir = store / launch.run_key(resolved(exp, [*job, *extra]))
            record(runs, [exp, *job], run_dir)
            if launch.reusable(run_dir):
                print(f"[figures] reusing {run_dir} ({launch.status(run_dir)['status']}): {' '.join(args)}", flush=True)
            else:
                nproc = cfg["hardware"]["nproc_per_node"] if fig.gpus > 1 else 1
                jobs.setdefault(run_dir, launch.Job([*args, "train.resume=auto"], run_dir, nproc, name=" ".join(args)))
    return launch.launch(list(jobs.values()), launcher, hydra_launcher=fig.hydra_launcher, tag="figures")


def reference_runs(rows: list[dict]) -> list[Run]:
    """The authors' evaluation rows as runs: one per run name, with its algorithm settings as its config."""
    runs: dict[str, Run] = {}
    for r in rows:
        alg = r.pop("alg")
        runs.setdefault(r["run_dir"], Run(r["run_dir"], [], config={"algorithm": alg})).evals.append(r)
    return list(runs.values())


def plot(name: str, runs: Path, out: Path, reference: Path | None) -> list[dict]:
    """The figure's PNG, ``mean_curves.csv`` and ``evals.csv`` from the runs under ``runs`` (and the authors'
    curves); prints the summary; returns the mean-curve rows."""
    fig = FIGURES[name]
    ours = group([load_run(d) for d in find_runs(runs)], fig.label) if runs.exists() else {}
    seeds = {"ours": {k: [r.curve("time", fig.metric) for r in rs] for k, rs in ours.items()}}
    if reference is not None and fig.reference is not None and reference.exists():
        theirs = group(reference_runs(fig.reference(reference)), fig.label)
        seeds["authors"] = {k: [r.curve("time", fig.metric) for r in rs] for k, rs in theirs.items()}
    curves = {src: mean_curves(by) for src, by in seeds.items()}
    bands = {src: {k: kept for k, cs in by.items() if (kept := [c for c in cs if len(c[0]) > 1])} for src, by in seeds.items()}
    rows = [row for source, by_label in curves.items() for row in table(by_label, source)]
    if not rows:
        raise SystemExit(f"[figures] no runs under {runs} and no reference curves: run `make reproduce-figure-{name}` first")
    write_csv(eval_rows(ours), out / "evals.csv", EVAL_FIELDS)
    write_curves(rows, out / "mean_curves.csv")
    ylabel = {"accuracy": "test accuracy", "both_accuracy": "test accuracy AND format"}[fig.metric]
    png = plot_curves(rows, out / "accuracy_vs_time.png", fig.title, fig.time_unit, ylabel)
    print(f"[figures] {png}\n[figures] {out / 'mean_curves.csv'}  {out / 'evals.csv'}")
    for line in figure_summary(curves, fig.baseline) + figure_bands(bands, fig.baseline, fig.band):
        print("[figures]", line)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    r = sub.add_parser("reproduce")
    r.add_argument("name", choices=[*FIGURES, *GROUPS])
    r.add_argument("--launcher", choices=list(launch.LAUNCHERS.names()), default="slurm")
    r.add_argument("--runs", type=Path, default=None, help="the figure's run directory (default: runs/paper/NAME)")
    r.add_argument("--seeds", default=None, help="comma-separated seeds instead of the sweep's (e.g. 1,2 for a smoke test)")
    r.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (right after NAME)")
    q = sub.add_parser("plot")
    q.add_argument("name", choices=[*FIGURES, *GROUPS])
    q.add_argument("--runs", type=Path, default=None, help="the figure's run directory (default: runs/paper/NAME)")
    q.add_argument("--out", type=Path, default=None, help="default: results/figure-NAME")
    q.add_argument("--reference", type=Path, default=None, help="the authors' curves (../shared/reference)")
    a = p.parse_args(argv)
    if a.cmd == "list":
        print("\n".join(f"{k:24s} {v.title}" for k, v in FIGURES.items()))
        return
    names, procs = GROUPS.get(a.name, [a.name]), []
    for name in names:  # --runs/--out name the figure's own directories; for a group, their parents
        runs = a.runs if a.runs and len(names) == 1 else (a.runs or Path("runs/paper")) / name
        if a.cmd == "reproduce":
            procs += reproduce(name, a.launcher, runs.resolve(), a.seeds, a.overrides)
        else:
            plot(name, runs, a.out if a.out and len(names) == 1 else (a.out or Path("results")) / f"figure-{name}", a.reference)
    launch.wait(procs, "figures")  # all arrays were submitted at once: wait for every one


if __name__ == "__main__":
    main()
