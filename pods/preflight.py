"""Checks of the machine a run starts on, made before any model or dataset loads: the device and dtype exist
here, GPU-only settings are not asked of a CPU, local files exist, hub ids can be reached (or are cached), and a
CUDA run's estimated peak memory fits its card (``pods.memory.estimator.check_fits``).

``check_environment(cfg)`` takes the validated config (the typed root) and raises ``ConfigError`` with one line
naming the key; the rules of a rollout engine's settings are the engine's own (``Engine.check``). ``pods.config.validate`` holds the rules that do not depend on the machine, so a GPU
experiment still validates on a CPU machine; this module says whether it can run on this one.
"""

from __future__ import annotations

import os
from pathlib import Path

from pods.errors import ConfigError, need
from pods.schema import Root

_TRUE = {"1", "true", "yes", "on"}
CPU_PROFILES = "hardware=cpu (or cpu_mb16, cpu_ddp2_zero3)"


def check_environment(cfg: Root) -> None:
    """This machine can run ``cfg`` (the validated root)."""
    from pods.gpu_env import card_memory_gb, check_c_compiler
    from pods.memory.estimator import check_fits

    world_size(cfg.hardware)  # before anything else: a launch of the wrong size is refused, whatever else is wrong
    cuda = cfg.hardware.device == "cuda"
    check_fits(cfg, card_memory_gb(cfg.hardware.gpu_memory_gb) if cuda else None)  # the visible card's memory over the profile's
    _device(cfg)
    check_c_compiler(cfg.hardware.device, cfg.rollout.name)  # Triton builds its launcher with a C compiler at engine start
    _files(cfg)
    _hub_datasets(cfg.dataset)


def world_size(hw, env: dict | None = None) -> None:
    """The launcher started ``hardware.nproc_per_node x hardware.nnodes`` processes, else ``ConfigError``: the per-rank
    keys (prompts per step, micro-batches) would scale the step with the world (a 4-GPU recipe on 8 ranks trains on
    twice its batch) without a word. No launcher (WORLD_SIZE unset): ``pods.config`` decides. ``hw``: the hardware
    section; ``hardware.check_world_size=false`` runs with any size."""
    env = os.environ if env is None else env
    world, want = env.get("WORLD_SIZE"), hw.nproc_per_node * hw.nnodes
    if world is None or not hw.check_world_size or int(world) == want:
        return
    raise ConfigError(
        f"launched as WORLD_SIZE={world} processes but hardware={hw.name} is written for hardware.nproc_per_node={hw.nproc_per_node} "
        f"x hardware.nnodes={hw.nnodes} = {want}: start {want} (torchrun --nproc_per_node {hw.nproc_per_node}, PODS_NPROC={hw.nproc_per_node}), "
        f"or set hardware.check_world_size=false to train on {world} ranks (each rank's batch keys then scale the step)"
    )


def _device(cfg: Root) -> None:
    import torch

    hw = cfg.hardware
    if hw.device == "cuda":
        need(
            torch.cuda.is_available(),
            f"hardware.device=cuda (hardware={hw.name}) but no CUDA device is visible here: use {CPU_PROFILES}",
        )
        return
    need(
        hw.dtype != "float16",
        "hardware.dtype=float16 needs a CUDA device (no fp16 loss scaling on CPU); valid on CPU: float32, bfloat16",
    )
    need(hw.dist_backend != "nccl", "hardware.dist_backend=nccl needs CUDA devices; valid on CPU: gloo")
    need(cfg.optim.name != "adamw_8bit", "optim.name=adamw_8bit (bitsandbytes) needs a CUDA device; valid on CPU: adamw")


def _files(cfg: Root) -> None:
    from pods.tasks.hub import empty_file

    for split in ("train", "test"):
        files = getattr(cfg.dataset, f"{split}_files", None)  # the hub dataset shape's local files
        for p in [files] if isinstance(files, str) else files or []:
            need(Path(p).is_file(), f"dataset.{split}_files: file not found: {p}")
            need(not empty_file(p), f"dataset.{split}_files: {p} is empty (no records)")
    resume = cfg.train.resume
    need(
        resume in (None, "auto") or Path(resume).is_file(),
        f"train.resume: file not found: {resume} (valid: null, auto or a checkpoint file)",
    )
    path, builder = cfg.model.path, cfg.model.builder
    if not builder and path and (Path(path).is_absolute() or path.startswith(".")):
        need(Path(path).is_dir(), f"model.path: directory not found: {path}")


def offline() -> bool:
    return any(os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def cached_dataset(hub_id: str) -> bool:
    """Whether a hub dataset has a copy in the local Hugging Face caches (hub snapshot or ``datasets`` arrow cache)."""
    from huggingface_hub import constants

    hub = Path(constants.HF_HUB_CACHE) / f"datasets--{hub_id.replace('/', '--')}"
    arrow = Path(os.environ.get("HF_DATASETS_CACHE", Path(constants.HF_HOME) / "datasets")) / hub_id.replace("/", "___")
    return hub.is_dir() or arrow.is_dir()


def _hub_datasets(ds) -> None:
    """A hub id while offline and not cached fails here, in one line, instead of deep inside ``datasets`` (``ds``: the
    dataset section; only the hub shape has hub ids)."""
    for split in ("train", "test"):
        hub = getattr(ds, f"{split}_hub", None)
        if getattr(ds, f"{split}_files", None) or not hub or not offline() or cached_dataset(hub.id):
            continue
        raise ConfigError(
            f"dataset.{split}_hub: hub dataset '{hub.id}' while offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE) and not in the "
            f"local cache: set dataset.{split}_files=/path/{split}.jsonl (json, jsonl, parquet or csv)"
        )
