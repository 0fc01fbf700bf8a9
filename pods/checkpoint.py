"""The whole loop state as one file: step, training clock, data position, RNG states, model + optimizer.

Checkpoints are written to a temporary name and renamed, so a kill mid-write never corrupts the latest.
Several processes: every rank calls ``save``/``load``; a backend with sharded state (DeepSpeed) writes its
shards into ``step_XXXXXX.shards/`` first, then rank 0 writes the file with every rank's RNG states.
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


def save(path: Path, loop: dict, backend, sampler, extra_rng: dict, dist=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(backend, "save_sharded"):
        backend.save_sharded(path.with_suffix(".shards"))
        state = {"shards": path.with_suffix(".shards").name}
    else:
        state = backend.state_dict()
    rngs = dist.gather_object({"rng": rng_state(), "extra_rng": extra_rng}) if dist else None
    if dist is None or dist.is_main:
        blob = {"loop": loop, "backend": state, "sampler": sampler.state_dict(), "rng": rng_state(), "extra_rng": extra_rng}
        if dist is not None and dist.world > 1:
            blob["ranks"] = rngs  # rank r resumes with rngs[r]
        tmp = path.with_suffix(".tmp")
        torch.save(blob, tmp)
        tmp.replace(path)
        (path.parent / "latest").write_text(path.name)
    if dist is not None:
        dist.barrier()
    return path


def latest(ckpt_dir: Path) -> Path | None:
    marker = ckpt_dir / "latest"
    return ckpt_dir / marker.read_text().strip() if marker.exists() else None


def load(path: Path, backend, sampler, dist=None) -> tuple[dict, dict]:
    """Restore backend and sampler in place; returns (loop state, this rank's extra rng states)."""
    if not path.exists():
        raise FileNotFoundError(f"train.resume: checkpoint {path} does not exist")
    blob = torch.load(path, map_location="cpu", weights_only=False)
    world = dist.world if dist is not None else 1
    ranks = blob.get("ranks") or [{"rng": blob["rng"], "extra_rng": blob["extra_rng"]}]
    if len(ranks) != world:
        raise ValueError(f"train.resume: checkpoint {path} was written by {len(ranks)} processes; this run has {world}")
    if "shards" in blob["backend"]:
        backend.load_sharded(path.parent / blob["backend"]["shards"])
    else:
        backend.load_state_dict(blob["backend"])
    sampler.load_state_dict(blob["sampler"])
    mine = ranks[dist.rank if dist is not None else 0]
    set_rng_state(mine["rng"])
    return blob["loop"], mine["extra_rng"]
