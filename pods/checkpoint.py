"""The whole loop state as one file: step, training clock, data position, RNG states, model + optimizer.

Checkpoints are written to a temporary name and renamed, so a kill mid-write never corrupts the latest.
Several processes: every rank calls ``save``/``load``; a backend with sharded state (DeepSpeed) writes its
shards into ``step_XXXXXX.shards/`` first, then rank 0 writes the file with every rank's RNG states.

Safe to load: the file holds only tensors and plain types (the Python and NumPy RNG states are converted to
tensors), tagged ``FORMAT``, and is read with ``torch.load(weights_only=True)``, which unpickles no code. A
file that is not a pods checkpoint (or was written before this format) fails with one line naming
``train.resume``, and so does one written by another number of processes or under another ZeRO stage (recorded
as ``zero_stage``), before any state is read into the backend. The run's settings were compared before anything
loaded (``pods.resume``). DeepSpeed's shard files are read the same way (``DeepSpeedBackend.load_sharded``).

Retention: ``keep`` (``train.keep_checkpoints``) keeps the newest k checkpoints of the run directory (with
their shard directories) and deletes older ones after the new one is complete; null keeps every one. At the end
of a run that was not pre-empted, ``train.checkpoint_at_end`` decides: ``full`` writes the resumable state (to
extend the run later), ``weights`` only the policy (``save_pretrained`` into ``<run_dir>/final``) and ``false``
nothing; with ``weights``/``false`` the run's periodic checkpoints (kept for pre-emption) are deleted too, so a
finished run leaves no optimizer state behind. A pre-empted run always writes the full state.
"""

from __future__ import annotations

import pickle
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from pods.schema import Train

FORMAT = "pods-checkpoint/2"
END_CHOICES = ("full", "weights", "false")


def end_mode(train: Train) -> str:
    """``train.checkpoint_at_end`` (``train``: the train section) as one of ``END_CHOICES`` (YAML true/false mean
    full/false)."""
    v = train.checkpoint_at_end
    if v is True:
        return "full"
    return "false" if v in (False, None) else str(v)


def rng_state() -> dict:
    """Every global RNG as tensors and ints (loadable with ``weights_only=True``); with CUDA in use, this process's
    CUDA generators too (``cuda``: one state per visible device; sampling on a GPU draws from them)."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = {"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() and torch.cuda.is_initialized() else {}
    return cuda | {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "mt": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }


def set_rng_state(state: dict) -> None:
    """The states ``rng_state`` took; the CUDA generators when the checkpoint has them and this process sees as many
    devices (a checkpoint written without CUDA leaves them as they are)."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
        torch.cuda.set_rng_state_all(state["cuda"])
    p, n = state["python"], state["numpy"]
    random.setstate((p["version"], tuple(p["mt"].tolist()), p["gauss"]))
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))


def save(path: Path, loop: dict, backend, sampler, extra_rng: dict, dist=None, keep: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if backend.sharded:
        backend.save_sharded(path.with_suffix(".shards"))
        state = {"shards": path.with_suffix(".shards").name}
    else:
        state = backend.state_dict()
    rngs = dist.gather_object({"rng": rng_state(), "extra_rng": extra_rng}) if dist else None
    if dist is None or dist.is_main:
        blob = {
            "format": FORMAT,
            "loop": loop,
            "backend": state,
            "sampler": sampler.state_dict(),
            "rng": rng_state(),
            "extra_rng": extra_rng,
            "zero_stage": zero_stage(backend),
        }
        if dist is not None and dist.world > 1:
            blob["ranks"] = rngs  # rank r resumes with rngs[r]
        tmp = path.with_suffix(".tmp")
        torch.save(blob, tmp)
        tmp.replace(path)
        (path.parent / "latest").write_text(path.name)
        prune(path.parent, keep, path)
    if dist is not None:
        dist.barrier()
    return path


def prune(ckpt_dir: Path, keep: int | None, current: Path) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (never ``current``), and shard directories whose file was
    never completed (a kill during a sharded save). Returns what was deleted."""
    if not keep:
        return []
    done = sorted(ckpt_dir.glob("step_*.pt"))
    old = [p for p in done[:-keep] if p != current]
    orphans = [d for d in ckpt_dir.glob("step_*.shards") if not d.with_suffix(".pt").exists() and d != current.with_suffix(".shards")]
    for p in old:
        shutil.rmtree(p.with_suffix(".shards"), ignore_errors=True)
        p.unlink(missing_ok=True)
    for d in orphans:
        shutil.rmtree(d, ignore_errors=True)
    return old + orphans


def discard(ckpt_dir: Path, dist=None) -> None:
    """Delete every checkpoint of a finished run (``checkpoint_at_end`` weights/false: nothing resumes it)."""
    if dist is not None:
        dist.barrier()
    if (dist is None or dist.is_main) and ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    if dist is not None:
        dist.barrier()


def latest(ckpt_dir: Path) -> Path | None:
    """The checkpoint the ``latest`` marker names; if that file is gone (deleted by hand, a copy without it), the newest
    ``step_*.pt`` that exists, said in one warning; None without a marker."""
    marker = ckpt_dir / "latest"
    if not marker.exists():
        return None
    named = ckpt_dir / marker.read_text().strip()
    steps = sorted(ckpt_dir.glob("step_*.pt"))
    if named.is_file() or not steps:
        return named  # a missing file with nothing to fall back to: read() refuses it in one line
    from pods.log import get

    get(__name__).warning(f"{marker} names {named.name}, which does not exist; resuming from the newest checkpoint, {steps[-1].name}")
    return steps[-1]


def read(path: Path) -> dict:
    """The checkpoint's contents, without running any code from the file; one clear line if it is not ours."""
    from pods.errors import ConfigError

    if not path.exists():
        raise ConfigError(f"train.resume: checkpoint {path} does not exist")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickled code, a zip of something else, truncation: all "not ours"
        raise ConfigError(f"train.resume: {path} is not a pods checkpoint ({type(e).__name__}: {_reason(e)})") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise ConfigError(f"train.resume: {path} is not a pods checkpoint of format {FORMAT} (found {found!r})")
    return blob


def zero_stage(backend) -> int | None:
    """The DeepSpeed ZeRO stage ``backend`` trains under (recorded in the checkpoint); None for the local backend."""
    return getattr(backend, "stage", None)


def _zero(stage: int | None) -> str:
    return "no ZeRO (one process's whole state)" if stage is None else f"ZeRO stage {stage}"


def _reason(e: Exception) -> str:
    """The informative line of an exception (torch's unpickling errors: the "WeightsUnpickler error" one), <= 200 chars."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    return next((line for line in lines if "WeightsUnpickler error" in line), lines[0])[:200]


def load(path: Path, backend, sampler, dist=None) -> tuple[dict, dict]:
    """Restore backend and sampler in place; returns (loop state, this rank's extra rng states)."""
    from pods.errors import ConfigError

    blob = read(path)
    world = dist.world if dist is not None else 1
    ranks = blob.get("ranks") or [{"rng": blob["rng"], "extra_rng": blob["extra_rng"]}]
    if len(ranks) != world:
        raise ConfigError(f"train.resume: checkpoint {path} was written by {len(ranks)} processes; this run has {world}")
    stage, now = (
        blob.get("zero_stage", zero_stage(backend)),
        zero_stage(backend),
    )  # (a checkpoint written before it was recorded: unchecked)
    if stage != now:
        raise ConfigError(
            f"train.resume: checkpoint {path} was written under {_zero(stage)}; this run trains under {_zero(now)} "
            "(hardware.backend, hardware.deepspeed.stage): a checkpoint resumes only under its own"
        )
    if "shards" in blob["backend"]:
        try:
            backend.load_sharded(path.parent / blob["backend"]["shards"])
        except pickle.UnpicklingError as e:
            raise ConfigError(f"train.resume: {path}'s shards hold something other than tensors and plain types ({_reason(e)})") from None
    else:
        backend.load_state_dict(blob["backend"])
    sampler.load_state_dict(blob["sampler"])
    mine = ranks[dist.rank if dist is not None else 0]
    set_rng_state(mine["rng"])
    return blob["loop"], mine["extra_rng"]
