"""Real tiny training runs for the tests that read a run directory (``pods-export``, ``pods-eval --each-checkpoint``):
trained through the command a user types, ``python -m pods.train``, run in-process (``support.doors``: its imports
are this process's, about 8 s saved a run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.config import ROOT
from support.doors import door

# three steps, a checkpoint after each, the full state kept at the end and final/ written too (train.save_final)
THREE_CHECKPOINTS = [
    "algorithm.n=8",
    "algorithm.m=4",
    "train.max_steps=3",
    "train.time_budget_s=null",
    "train.prompts_per_step=1",
    "train.checkpoint_every_steps=1",
    "train.checkpoint_at_end=full",
    "train.save_final=true",
    "eval.max_examples=8",
    "eval.repeats=1",
    "eval.every_s=null",
    "eval.at_start=false",
]


def python(args: list[str], timeout: int = 600, **env) -> subprocess.CompletedProcess:
    """``python ARGS`` in the repository with one thread, output captured."""
    full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=full, timeout=timeout)


def train_run(run_dir: Path, finetune: str = "lora", extra: list[str] | None = None) -> Path:
    """A tiny run with checkpoints step_000001..3.pt and final/ (``THREE_CHECKPOINTS``), ``finetune`` full or lora."""
    p = door("pods.train", [*THREE_CHECKPOINTS, f"hardware.finetune={finetune}", *(extra or []), f"hydra.run.dir={run_dir}"])
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir


# the smallest run that still evaluates: 4 rollouts a prompt, 2 kept, 8 test problems once, no time budget
TINY_STEPS = [
    "algorithm.n=4",
    "algorithm.m=2",
    "train.time_budget_s=null",
    "eval.max_examples=8",
    "eval.repeats=1",
    "eval.every_s=null",
]

# four steps, a checkpoint and an evaluation after step 2: the run whose rows main 648d2cc, before the producer existed,
# logged (tests/support/main_rows_648d2cc*.jsonl), for ``train.max_staleness=0`` == that loop (docs/async.md)
MAIN_648D2CC_RUN = [
    *TINY_STEPS,
    "train.prompts_per_step=2",
    "train.max_steps=4",
    "train.checkpoint_every_steps=2",  # a drain after step 2 under train.max_staleness >= 1
    "eval.every_steps=2",
]


def untimed(rows: list[dict]) -> list[dict]:
    """Metrics rows without their timings (``train_time``, ``t_*``) and the run-local ``model_dir``."""
    return [{k: v for k, v in r.items() if not k.startswith(("train_time", "t_")) and k != "model_dir"} for r in rows]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its bytes' hash (equal snapshots: the directory is byte for byte as it was)."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def one_line(p) -> str:
    """A refusal of ``python -m pods.train``: exit code 2, one line on stderr, no traceback; the line."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    return lines[0]


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of ``run_dir`` as ``tmp_path/run`` (a test changes its copy, the module's run stays as it was)."""
    import shutil

    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run"
