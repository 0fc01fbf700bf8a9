"""Runs identified by their resolved config, shared by every figure that needs them.

Figs. 3, 4 and 5 all contain PODS 64->16 on GSM8K with the same seeds; each figure used to re-run them. A run's
identity is now a hash of its resolved config without the bookkeeping that cannot change its result (run
directory, logger, SLURM settings, resume mode): ``<store>/<key>``. A figure lists its runs in
``<figure dir>/runs.json`` (job overrides -> run directory) and ``pods.figures plot`` reads that list.

A run directory holds ``launch.json`` from the moment it is launched: ``{"status": "launched" | "finished" |
"failed", "launcher", "pid", "cmd"}``. ``reusable`` says whether a figure may take an existing run instead of
launching it: finished, or launched and still running (a local process alive, or any SLURM submission: its
queue owns it). A failed run, or a local one whose process is gone, is launched again with
``train.resume=auto`` and continues from its last checkpoint. Delete ``launch.json`` to re-run a SLURM run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

BOOKKEEPING = ("hydra", "logger", "hardware.slurm", "train.resume")  # keys that never change a run's result


def run_key(cfg: dict) -> str:
    """12 hex digits of the SHA-256 of the resolved config (sorted JSON) without ``BOOKKEEPING``."""
    cfg = json.loads(json.dumps(cfg, default=str))
    for dotted in BOOKKEEPING:
        *parents, last = dotted.split(".")
        node = cfg
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]


def status(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "launch.json"
    return json.loads(path.read_text()) if path.exists() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OSError):
        return False
    return True


def reusable(run_dir: Path) -> bool:
    """True when the run finished, or was launched and is still running (see the module docstring)."""
    s = status(run_dir)
    if s is None:
        return False
    if s["status"] == "finished":
        return True
    if s["status"] == "launched":
        return s["launcher"] == "slurm" or _alive(int(s["pid"]))
    return False


def mark(run_dir: Path, state: str, launcher: str, cmd: list[str]) -> None:
    """Write ``launch.json`` (the launching process's pid: a local run runs inside it)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "launch.json").write_text(json.dumps({"status": state, "launcher": launcher, "pid": os.getpid(), "cmd": cmd}, indent=1))


def record(fig_dir: Path, job: list[str], run_dir: Path) -> None:
    """Add ``job -> run_dir`` to the figure's ``runs.json``."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    path = fig_dir / "runs.json"
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[" ".join(job)] = str(run_dir)
    path.write_text(json.dumps(runs, indent=1, sort_keys=True))


def listed(fig_dir: Path) -> list[Path]:
    """The run directories a figure's ``runs.json`` lists (none when there is no list)."""
    path = Path(fig_dir) / "runs.json"
    return [Path(p) for p in json.loads(path.read_text()).values()] if path.exists() else []
