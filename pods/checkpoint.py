"""The whole loop state as one file: step, training clock, data position, RNG states, model + optimizer.

Checkpoints are written to a temporary name and renamed, so a kill mid-write never corrupts the latest.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])


def save(path: Path, loop: dict, backend, sampler, extra_rng: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"loop": loop, "backend": backend.state_dict(), "sampler": sampler.state_dict(), "rng": rng_state(), "extra_rng": extra_rng}
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)
    (path.parent / "latest").write_text(path.name)
    return path


def latest(ckpt_dir: Path) -> Path | None:
    marker = ckpt_dir / "latest"
    return ckpt_dir / marker.read_text().strip() if marker.exists() else None


def load(path: Path, backend, sampler) -> tuple[dict, dict]:
    """Restore backend and sampler in place; returns (loop state, extra rng states)."""
    if not path.exists():
        raise FileNotFoundError(f"train.resume: checkpoint {path} does not exist")
    blob = torch.load(path, map_location="cpu", weights_only=False)
    backend.load_state_dict(blob["backend"])
    sampler.load_state_dict(blob["sampler"])
    set_rng_state(blob["rng"])
    return blob["loop"], blob["extra_rng"]
