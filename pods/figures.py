"""The paper's figures: which experiments and sweep make each one, how to launch them, how to draw them.

    python -m pods.figures reproduce NAME [HYDRA OVERRIDES...] [--launcher slurm|local] [--runs DIR] [--seeds 1,2]
    python -m pods.figures plot NAME [--runs DIR] [--out DIR] [--reference DIR]
    python -m pods.figures list

``reproduce`` runs every experiment of the figure over its sweep (``conf/sweep``) into ``RUNS/<experiment>/``.
``RUNS`` defaults to runs/paper/NAME;
single-GPU figures run as Hydra multiruns (``hydra/launcher=slurm``: one SLURM job array per experiment, submitted
together; ``local``: one run after another here), 8-GPU figures as one ``slurm/run_8gpu.sbatch`` job per seed
(``local``: torchrun, one run after another). Every run has ``train.resume=auto``, so re-running continues
unfinished runs. ``plot`` reads every run's config.json + metrics.jsonl under ``RUNS``, labels runs by
their algorithm settings, and draws mean +- 1.96 standard errors across seeds on a common time grid, with the
authors' released curves (``--reference``, ../shared/reference) dashed in the same colours.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pods import runstore
from pods.plot import CURVE_FIELDS, eval_rows, mean_curves, plot_mean_curves, time_to_reach, write_csv

ROOT = Path(__file__).resolve().parents[1]


def arm(a: dict) -> str:
    """A curve's label from algorithm settings: GRPO n/m, GRPO-GA n/m, or PODS n->m (rule when not max-variance)."""
    if a.get("grad_accum"):
        return f"GRPO-GA {a['n']}/{a['m']}"
    if a["rule"] == "all" or a["n"] == a["m"]:  # every rollout kept: GRPO, whatever the rule
        return f"GRPO {a['n']}/{a['m']}"
    return f"PODS {a['n']}→{a['m']}" + ("" if a["rule"] == "max_variance" else f" {a['rule']}")


def by_rule(a: dict) -> str:
    return a["rule"].replace("_", "-")


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
    reference: Callable[[Path], list[dict]] | None = None
    baseline: str | None = None  # the label whose best mean accuracy sets the speed-up target
    time_unit: str = "h"
    metric: str = "accuracy"  # the eval metric plotted: accuracy | both_accuracy (answer AND format, the Llama panel)


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
    "cpu": Figure(
        "toy arithmetic, tiny Qwen2, CPU: GRPO vs GRPO-GA vs GRPO-PODS",
        ("toy_grpo_16_16_cpu", "toy_grpo_ga_64_16_cpu", "toy_pods_64_16_cpu"),
        "seeds_cpu",
        baseline="GRPO 16/16",
        time_unit="s",
    ),
}
GROUPS = {"3": [k for k in FIGURES if k.startswith("3-")], "4": ["4-n", "4-m"]}


def sweep_jobs(exp: str, sweep: str, overrides: list[str] = ()) -> tuple[list[list[str]], dict]:
    """The jobs Hydra's basic sweeper would launch for ``experiment=exp +sweep=sweep``, and the resolved run config."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from pods.train import CONF, expand

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", [f"experiment={exp}", f"+sweep={sweep}"], return_hydra_config=True)
    params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()] + list(overrides)
    jobs = expand(params)
    task = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    return jobs, task


def resolved(exp: str, overrides: list[str]) -> dict:
    """The resolved run config of ``experiment=exp`` with ``overrides`` (what pods.train would run)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", [f"experiment={exp}", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def reproduce(name: str, launcher: str, runs: Path, seeds: str | None, extra: list[str]) -> list[subprocess.Popen]:
    """Launch the figure's runs that no figure has launched yet (pods.runstore: one directory per resolved config
    under ``runs/../by-config``); list all of them in ``runs/runs.json``. With SLURM, returns the submitting
    processes (each waits for its job)."""
    fig, store = FIGURES[name], runs.parent / "by-config"
    seed_arg = [f"seed={seeds}"] if seeds else []
    procs = []
    for exp in fig.experiments:
        jobs, cfg = sweep_jobs(exp, fig.sweep, seed_arg)
        for job in jobs:
            args = [f"experiment={exp}", *job, *extra]
            run_dir = store / runstore.run_key(resolved(exp, [*job, *extra]))
            runstore.record(runs, [exp, *job], run_dir)
            if runstore.reusable(run_dir):
                print(f"[figures] reusing {run_dir} ({runstore.status(run_dir)['status']}): {' '.join(args)}", flush=True)
                continue
            procs += _launch(name, fig, cfg, launcher, args, run_dir)
    return procs


def _launch(name: str, fig: Figure, cfg: dict, launcher: str, args: list[str], run_dir: Path) -> list[subprocess.Popen]:
    """Run one job into ``run_dir``: locally (waits) or on SLURM (1 GPU: a Hydra submitit job; 8 GPUs: sbatch)."""
    if fig.gpus == 1 and launcher == "slurm":
        cmd = [
            sys.executable,
            "-m",
            "pods.train",
            "-m",
            *args,
            f"hydra.sweep.dir={run_dir.parent}",
            f"hydra.sweep.subdir={run_dir.name}",
            "train.resume=auto",
            "hydra/launcher=slurm" + ("_cpu" if name == "cpu" else ""),
        ]
    elif fig.gpus == 1:
        cmd = [sys.executable, "-m", "pods.train", *args, f"hydra.run.dir={run_dir}", "train.resume=auto"]
    elif launcher == "slurm":
        cmd = ["sbatch", "--parsable", f"--job-name=pods-{args[0].split('=', 1)[1]}", str(ROOT / "slurm" / "run_8gpu.sbatch"), *args]
    else:
        nproc = cfg["hardware"]["nproc_per_node"]
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "pods.train",
            *args,
            f"hydra.run.dir={run_dir}",
            "train.resume=auto",
        ]
    print("[figures]", f"PODS_RUN_DIR={run_dir}" if cmd[0] == "sbatch" else "", " ".join(cmd), flush=True)
    runstore.mark(run_dir, "launched", launcher, cmd)
    if launcher == "slurm" and fig.gpus == 1:  # waited for by its own process: submit them all at once
        return [subprocess.Popen(cmd, cwd=ROOT)]
    if launcher == "slurm":
        subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "PODS_ROOT": str(ROOT), "PODS_RUN_DIR": str(run_dir)})
        return []
    ok = subprocess.run(cmd, cwd=ROOT).returncode == 0
    runstore.mark(run_dir, "finished" if ok else "failed", launcher, cmd)
    if not ok:
        raise SystemExit(f"[figures] run failed: {run_dir}; re-running the same command continues it (train.resume=auto)")
    return []


def collect(root: Path, label: Callable[[dict], str]) -> dict[str, list[Path]]:
    """Finished or running runs, grouped by their label: those ``root/runs.json`` lists (shared runs), else
    every run under ``root`` (any depth)."""
    runs: dict[str, list[Path]] = {}
    listed = [d / "config.json" for d in runstore.listed(root)]
    for cfg_path in listed if listed else sorted(root.rglob("config.json")):
        if cfg_path.exists() and (cfg_path.parent / "metrics.jsonl").exists():
            runs.setdefault(label(json.loads(cfg_path.read_text())["algorithm"]), []).append(cfg_path.parent)
    return runs


def summarize(curves: list[dict], baseline: str | None) -> list[str]:
    """Start / best / end of each mean curve and the paper's speed-up metric: how much sooner each curve first
    reaches 99% of the baseline's best mean accuracy. Only grid points averaging at least half of a curve's
    runs count (a curve's tail, covered by the longest runs only, would be noise)."""
    lines = []
    for source in dict.fromkeys(c["source"] for c in curves):
        pts = {}
        for label in dict.fromkeys(c["label"] for c in curves if c["source"] == source):
            all_pts = [c for c in curves if c["label"] == label and c["source"] == source]
            pts[label] = [c for c in all_pts if 2 * c["runs"] >= max(p["runs"] for p in all_pts)]
            best, first, last = max(pts[label], key=lambda c: c["mean"]), pts[label][0], pts[label][-1]
            lines.append(
                f"{source:7s} {label:22s} runs {max(c['runs'] for c in all_pts):2d}  first {first['mean']:.3f} at {first['time']:.0f} s  "
                f"best {best['mean']:.3f} +- {1.96 * best['se']:.3f} at {best['time']:.0f} s  last {last['mean']:.3f} at {last['time']:.0f} s"
            )
        if baseline in pts:
            target = 0.99 * max(c["mean"] for c in pts[baseline])
            t_base = time_to_reach(pts[baseline], baseline, target, source)
            for label in (k for k in pts if k != baseline):
                t = time_to_reach(pts[label], label, target, source)
                ratio = f"{t_base / t:.2f}x" if t and t_base else ("n/a (never reached)" if t is None else "n/a")
                lines.append(
                    f"{source:7s} time to 99% of {baseline}'s best mean ({target:.3f}): {baseline} {t_base:.0f} s, "
                    f"{label} {'never' if t is None else f'{t:.0f} s'}: speed-up {ratio}"
                )
    return lines


def plot(name: str, runs: Path, out: Path, reference: Path | None) -> list[dict]:
    fig = FIGURES[name]
    ours = eval_rows(collect(runs, fig.label)) if runs.exists() else []
    curves = mean_curves(ours, metric=fig.metric)
    if reference is not None and fig.reference is not None and reference.exists():
        theirs = [{**r, "label": fig.label(r.pop("alg"))} for r in fig.reference(reference)]
        curves += mean_curves(theirs, source="authors", metric=fig.metric)
    if not curves:
        raise SystemExit(f"[figures] no runs under {runs} and no reference curves: run `make reproduce-figure-{name}` first")
    write_csv(ours, out / "evals.csv")
    write_csv(curves, out / "mean_curves.csv", CURVE_FIELDS)
    ylabel = {"accuracy": "test accuracy", "both_accuracy": "test accuracy AND format"}[fig.metric]
    png = plot_mean_curves(curves, out / "accuracy_vs_time.png", fig.title, fig.time_unit, ylabel)
    print(f"[figures] {png}\n[figures] {out / 'mean_curves.csv'}  {out / 'evals.csv'}")
    for line in summarize(curves, fig.baseline):
        print("[figures]", line)
    return curves


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    r = sub.add_parser("reproduce")
    r.add_argument("name", choices=[*FIGURES, *GROUPS])
    r.add_argument("--launcher", choices=["slurm", "local"], default="slurm")
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
    if any([p.wait() != 0 for p in procs]):  # all arrays were submitted at once: wait for every one
        raise SystemExit("[figures] a sweep failed; re-running the same command continues unfinished runs (train.resume=auto)")


if __name__ == "__main__":
    main()
