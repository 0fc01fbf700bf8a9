"""The ``hardware`` section: the device profile, LoRA, DeepSpeed and SLURM settings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from pods.schema.base import Frac, Pos, PosF, Section


class Lora(Section):
    r: Pos = 16
    alpha: PosF = 16.0
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    target_modules: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class DeepSpeed(Section):
    stage: Literal[2, 3] = 3  # 3: params + grads + optimizer state partitioned; 2: grads + optimizer state
    torch_adam: bool = True  # torch's AdamW; false = DeepSpeed's FusedAdam, JIT-built with nvcc at start-up
    overlap_comm: bool = False
    offload_optimizer: Literal["cpu", "nvme"] | None = None
    offload_param: Literal["cpu", "nvme"] | None = None  # stage 3 only
    config: dict[str, Any] = {}  # merged verbatim into the DeepSpeed config


class Slurm(Section):
    gpus_per_node: Pos | None = None
    cpus_per_task: Pos = 2
    mem_gb: PosF = 8.0
    constraint: str | None = None
    timeout_min: Pos = 60


class Hardware(Section):
    name: str
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    backend: str = "local"  # pods.backends.BACKENDS
    dist_backend: Literal["gloo", "nccl"] | None = None  # the process group every rank joins (pods.distributed)
    dist_timeout_s: PosF = 1800.0  # longest wait in a collective before the run fails (a hung rank; covers a ZeRO-3 save)
    nproc_per_node: Pos = 1  # processes the launcher should start (torchrun --nproc_per_node decides)
    # the world the profile is written for: a launch of another size is refused (pods.preflight.world_size)
    nnodes: Pos = 1  # nodes of a multi-node run (slurm/run_multinode.sbatch sets it): WORLD_SIZE must be nproc_per_node x nnodes
    check_world_size: bool = True  # false: run with whatever WORLD_SIZE the launcher gave (per-rank batch keys then scale the step)
    finetune: Literal["full", "lora"] = "full"
    lora: Lora = Lora()
    micro_batch_size: Pos = 64  # sequences per forward/backward (per rank): memory only, gradients are identical
    micro_batch_tokens: Pos | None = None  # rows sorted by length, cut at this many padded tokens, each trimmed to its longest; null = off
    logprob_chunk_tokens: Pos | None = None  # tokens per chunk of the fp32 log-softmax over the vocabulary; null = one chunk
    gradient_checkpointing: bool = False
    # vLLM's share of a GPU it has to itself: the end-of-run suite's clean process (the trainer's memory given back
    # first); vLLM's default, 0.5, would leave half the card idle
    vllm_alone_share: Frac = 0.85
    gpu_memory_gb: PosF | None = None  # one card's memory, GB (1e9 B): pods.memory refuses a CUDA run that would not fit; null = unchecked
    torch_threads: Pos | None = None
    optimizer: str = "adamw"  # the profile's optimizer: optim.name when that is null (l40s_lora: adamw_8bit, the paper's)
    deepspeed: DeepSpeed = DeepSpeed()  # read by backend=deepspeed only
    slurm: Slurm | None = None
