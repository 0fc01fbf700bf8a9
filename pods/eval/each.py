"""``pods-eval --each-checkpoint RUN``: every checkpoint of a run on one suite, one summary each, and a curve over them.

The points: ``base``, the model the run started from (step 0), every ``RUN/checkpoints/step_N.pt`` (step N) and
``RUN/final/`` (step: the run's last training step in metrics.jsonl), ``final/`` left out when a checkpoint has that
step (the same weights). ``--checkpoint`` restricts it to one point (``base``, ``step_N``, ``final`` or ``latest``). Each point is evaluated by
``pods.eval.run.evaluate_suite`` into ``OUT/eval/<suite>/checkpoints/<point>/`` (``step_000002``, ``final``): its
summary.json, table.md, samples.jsonl and config.json, as ``pods-eval`` writes them for one model. A point whose
summary is there already, from the same suite and options, is kept, not evaluated again (a rerun after a failed job
evaluates only what is missing).

Where: ``--launcher local`` (default) evaluates them one after another in this process; ``--launcher submitit``
submits one SLURM job per point through ``pods.launch`` (its plain-submitit launcher: the executor, the resources
from ``PODS_SLURM_*``, ``launch.json`` beside each summary; ``PODS_SUBMITIT_CLUSTER=local`` runs them as local
processes). Each job runs this same command restricted to its point (``--checkpoint POINT``) with the resources of the
run's own profile (its ``hardware.slurm`` block; one GPU for a GPU run: an evaluation is one process) on the run's
device and dtype unless ``--device`` / ``--dtype`` say otherwise; this process waits for them all, then writes the curve.

A sharded (DeepSpeed ZeRO) checkpoint (``step_N.pt`` beside its ``step_N.shards/``) holds no model one process can
load: it is left out up front, said in one line, and its ``final/`` (consolidated at the end) is evaluated.

The curve: ``OUT/eval/<suite>/curve.csv``, one row per point and benchmark (and ``macro``, the suite's average):
``step, checkpoint, benchmark, avg@n, pass@k..., maj@k...``; ``curve.png``: avg@n against the training step.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from pods.errors import ConfigError


@dataclass(frozen=True)
class Point:
    name: str  # step_000002 | final: the folder under checkpoints/ and what --checkpoint names in a job
    step: int | None
    checkpoint: str | None  # the file under RUN/checkpoints/, None for final/


def points(run: Path) -> list[Point]:
    """The run's checkpoints by step, then ``final/`` unless a checkpoint holds its step (see the module docstring)."""
    from pods.eval.weights import last_step

    found, sharded = [Point("base", 0, "base")], []
    for f in sorted((run / "checkpoints").glob("step_*.pt")):
        if f.with_suffix(".shards").is_dir():  # DeepSpeed ZeRO's partitions: no model one process loads (final/ is whole)
            sharded.append(f.name)
            continue
        step = re.fullmatch(r"step_(\d+)\.pt", f.name)
        found.append(Point(f.stem, int(step.group(1)) if step else None, f.name))
    final = run / "final"
    if (final / "config.json").is_file() or (final / "adapter_config.json").is_file():
        step = last_step(run)
        if step is None or step not in {p.step for p in found}:
            found.append(Point("final", step, None))
    if sharded:
        print(f"pods-eval: left out: {', '.join(sharded)} (sharded DeepSpeed checkpoints; final/ is whole)", file=sys.stderr, flush=True)
    if len(found) == 1:  # the base point alone
        none = "only sharded (DeepSpeed) checkpoints and no final/" if sharded else "no checkpoints/step_*.pt and no final/"
        raise ConfigError(f"--each-checkpoint: {run} has no checkpoint pods-eval can load ({none})")
    return found


def select(run: Path, only: str | None) -> list[Point]:
    """Every point of ``run``, or the one ``only`` names (``base``, ``step_000002``, ``step_000002.pt``, ``final``, or
    ``latest``: the checkpoint the run's marker names, as single mode reads it)."""
    from pods.checkpoint import latest
    from pods.eval.weights import run_config

    if run_config(run) is None:
        raise ConfigError(f"--each-checkpoint needs a pods run directory; '{run}' is not one (no pods config.json)")
    every = points(run)
    if only is None:
        return every
    if only == "latest":
        newest = latest(run / "checkpoints") or next(iter(sorted((run / "checkpoints").glob("step_*.pt"))[-1:]), None)
        only = newest.name if newest is not None else "final"
    chosen = [p for p in every if only in (p.name, p.checkpoint)]
    if not chosen:
        raise ConfigError(f"--checkpoint: {only} is not a checkpoint of {run}; its points: {', '.join(p.name for p in every)}")
    return chosen


def done(out: Path, config: dict) -> bool:
    """``out`` holds a summary written with ``config`` (suite and options as config.json records them)."""
    try:
        written = json.loads((out / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (out / "summary.json").is_file() and all(written.get(k) == v for k, v in config.items())


def evaluate_each(run: Path, suite, options, root: Path, chosen: list[Point], data: dict) -> list[str]:
    """Evaluate each point here, one after another, into ``root/checkpoints/<point>/``; the points that failed (one
    line each, the others go on)."""
    from pods.eval.run import evaluate_suite, recorded
    from pods.eval.weights import resolve

    failed = []
    for i, p in enumerate(chosen, 1):
        out = root / "checkpoints" / p.name
        if done(out, {"suite": suite.model_dump(), **recorded(options)}):
            print(f"[pods-eval] {p.name} ({i}/{len(chosen)}): evaluated already ({out}/summary.json)", flush=True)
            continue
        print(f"[pods-eval] {p.name} ({i}/{len(chosen)}, step {p.step}) -> {out}", flush=True)
        try:
            evaluate_suite(suite, resolve(str(run), p.checkpoint), options, out, data)
        except ConfigError as e:
            print(f"pods-eval: {p.name}: {e}", file=sys.stderr, flush=True)
            failed.append(p.name)
    return failed


def job_hardware(run: Path) -> dict:
    """The hardware section an evaluation job of ``run`` asks SLURM for: the run's own profile (its ``slurm`` block:
    CPUs, memory, time, constraint), one GPU on a GPU run (an evaluation is one process)."""
    from pods.eval.weights import run_config

    hardware = dict((run_config(run) or {}).get("hardware") or {})
    slurm = dict(hardware.get("slurm") or {})
    slurm["gpus_per_node"] = 1 if hardware.get("device") == "cuda" else None
    return {**hardware, "slurm": slurm}


def device_args(run: Path, device: str | None, dtype: str | None) -> list[str]:
    """``--device`` and ``--dtype`` of a job: as given, else the run's own (a GPU run's checkpoints on its GPU)."""
    hardware = job_hardware(run)
    return ["--device", device or hardware.get("device", "cpu"), "--dtype", dtype or hardware.get("dtype", "float32")]


def eval_jobs(run: Path, root: Path, chosen: list[Point], job_args: list[str]) -> list:
    """One ``pods.launch.Job`` per point: ``python -m pods.eval RUN --each-checkpoint --checkpoint POINT JOB_ARGS`` with
    the run's python (a GPU run: the GPU environment's) and resources (``job_hardware``)."""
    from pods.gpu_env import job_python
    from pods.launch import Job

    hardware = job_hardware(run)
    python = job_python(hardware.get("device") == "cuda")  # a GPU run's checkpoints: the GPU python evaluates them
    jobs = []
    for p in chosen:
        cmd = [python, "-m", "pods.eval", str(run), "--each-checkpoint", "--checkpoint", p.name, *job_args]
        jobs.append(Job([], root / "checkpoints" / p.name, name=f"eval-{p.name}", cmd=cmd, python=python, hardware=hardware))
    return jobs


def submit_each(run: Path, root: Path, chosen: list[Point], job_args: list[str], launcher: str) -> list[str]:
    """One job per point through ``pods.launch`` (``launcher``: ``submitit``; ``eval_jobs``); waits for all; the points
    whose job failed."""
    from pods.launch import launch

    submitted = launch(eval_jobs(run, root, chosen, job_args), launcher, tag="pods-eval")
    return [p.name for p, s in zip(chosen, submitted) if s.wait() != 0]


def curve_rows(root: Path, chosen: list[Point]) -> list[dict]:
    """One row per evaluated point and benchmark (``macro`` last), from the points' summary.json files."""
    rows = []
    for p in chosen:
        file = root / "checkpoints" / p.name / "summary.json"
        if not file.is_file():
            continue
        summary = json.loads(file.read_text())
        for bench, m in [*summary["benchmarks"].items(), ("macro", summary["macro"])]:
            row = {"step": p.step, "checkpoint": p.name, "benchmark": bench, "avg@n": m["avg@n"]}
            row |= {f"pass@{k}": v for k, v in m["pass@k"].items()} | {f"maj@{k}": v for k, v in m["maj@k"].items()}
            rows.append(row)
    return rows


def write_curve(root: Path, chosen: list[Point]) -> Path | None:
    """``root``/curve.csv and curve.png over the points evaluated (None when none was)."""
    rows = curve_rows(root, chosen)
    if not rows:
        return None
    head = list(dict.fromkeys(k for r in rows for k in r))
    with (root / "curve.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=head, restval="")
        w.writeheader()
        w.writerows(rows)
    plot(rows, root / "curve.png")
    return root / "curve.csv"


def plot(rows: list[dict], file: Path) -> None:
    """avg@n against the training step, one line per benchmark (points without a step are not drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    benches = list(dict.fromkeys(r["benchmark"] for r in rows))
    for bench in benches if len(benches) > 2 else benches[:1]:  # one benchmark: its macro average is the same line
        xy = sorted((r["step"], r["avg@n"]) for r in rows if r["benchmark"] == bench and r["step"] is not None)
        if xy:
            ax.plot(*zip(*xy), marker="o", label=bench, linestyle="--" if bench == "macro" else "-")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("avg@n (mean accuracy over samples)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(file, dpi=100)
    plt.close(fig)
