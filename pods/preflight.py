"""Checks of the machine a run starts on, made before any model or dataset loads: the device and dtype exist
here, GPU-only settings are not asked of a CPU, local files exist, hub ids can be reached (or are cached), and a
CUDA run's estimated peak memory fits its card (``pods.memory.check_fits``).

``check_environment(cfg)`` takes the validated config (``pods.schema.check``) and raises ``ConfigError`` with one
line naming the key. ``pods.config.validate`` holds the rules that do not depend on the machine, so a GPU
experiment still validates on a CPU machine; this module says whether it can run on this one.
"""

from __future__ import annotations

import os
from pathlib import Path

from pods.config import ConfigError

_TRUE = {"1", "true", "yes", "on"}
CPU_PROFILES = "hardware=cpu (or cpu_mb16, cpu_ddp2_zero3)"


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def check_environment(cfg: dict) -> None:
    from pods.memory import check_fits

    check_fits(cfg)  # a CUDA run's memory estimate against hardware.gpu_memory_gb: true on any machine, so first
    _device(cfg)
    _files(cfg)
    _hub_datasets(cfg["dataset"])


def _device(cfg: dict) -> None:
    import torch

    hw, ro = cfg["hardware"], cfg["rollout"]
    if hw["device"] == "cuda":
        _need(
            torch.cuda.is_available(),
            f"hardware.device=cuda (hardware={hw['name']}) but no CUDA device is visible here: use {CPU_PROFILES}",
        )
        return
    _need(
        hw["dtype"] != "float16",
        "hardware.dtype=float16 needs a CUDA device (no fp16 loss scaling on CPU); valid on CPU: float32, bfloat16",
    )
    _need(hw.get("dist_backend") != "nccl", "hardware.dist_backend=nccl needs CUDA devices; valid on CPU: gloo")
    _need(cfg["optim"]["name"] != "adamw_8bit", "optim.name=adamw_8bit (bitsandbytes) needs a CUDA device; valid on CPU: adamw")
    _need(
        not ro.get("enable_sleep_mode"), "rollout.enable_sleep_mode=true needs a CUDA device (it frees GPU memory); set it to false on CPU"
    )
    _need(ro.get("dtype", "float32") != "float16", "rollout.dtype=float16 needs a CUDA device; valid on CPU: float32, bfloat16")


def _files(cfg: dict) -> None:
    ds = cfg["dataset"]
    for split in ("train", "test"):
        files = ds.get(f"{split}_files")
        for p in [files] if isinstance(files, str) else files or []:
            _need(Path(p).is_file(), f"dataset.{split}_files: file not found: {p}")
    resume = cfg["train"]["resume"]
    _need(
        resume in (None, "auto") or Path(resume).is_file(),
        f"train.resume: file not found: {resume} (valid: null, auto or a checkpoint file)",
    )
    path, builder = cfg["model"]["path"], cfg["model"]["builder"]
    if not builder and path and (Path(path).is_absolute() or path.startswith(".")):
        _need(Path(path).is_dir(), f"model.path: directory not found: {path}")


def offline() -> bool:
    return any(os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def cached_dataset(hub_id: str) -> bool:
    """Whether a hub dataset has a copy in the local Hugging Face caches (hub snapshot or ``datasets`` arrow cache)."""
    from huggingface_hub import constants

    hub = Path(constants.HF_HUB_CACHE) / f"datasets--{hub_id.replace('/', '--')}"
    arrow = Path(os.environ.get("HF_DATASETS_CACHE", Path(constants.HF_HOME) / "datasets")) / hub_id.replace("/", "___")
    return hub.is_dir() or arrow.is_dir()


def _hub_datasets(ds: dict) -> None:
    """A hub id while offline and not cached fails here, in one line, instead of deep inside ``datasets``."""
    for split in ("train", "test"):
        hub = ds.get(f"{split}_hub")
        if ds.get(f"{split}_files") or not hub or not offline() or cached_dataset(hub["id"]):
            continue
        raise ConfigError(
            f"dataset.{split}_hub: hub dataset '{hub['id']}' while offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE) and not in the "
            f"local cache: set dataset.{split}_files=/path/{split}.jsonl (json, jsonl, parquet or csv)"
        )
