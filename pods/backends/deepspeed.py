"""Full fine-tuning over several processes with DeepSpeed ZeRO-3 (parameters, gradients and optimizer state
partitioned over ranks) or ZeRO-2 (gradients and optimizer state partitioned; what the authors used).

Launch: ``torchrun --nproc_per_node N -m pods.train hardware=h100x8_zero3 ...`` (or the ``deepspeed``
launcher). The DeepSpeed config is generated from the Hydra config (``ds_config``): stage, bf16/fp32,
gradient clipping = ``optim.max_grad_norm``, micro-batch, AdamW; gradient checkpointing is HF's
(``hardware.gradient_checkpointing``). AdamW is torch's (``hardware.deepspeed.torch_adam: true``, every profile):
DeepSpeed's FusedAdam is JIT-compiled at start-up with an nvcc matching torch's CUDA (13 for torch 2.13), a
toolkit ``environment.yml`` does not install; ``torch_adam: false`` without nvcc fails before the model loads.

Gradient accumulation belongs to the loop: ``Backend.update`` calls ``backward`` once per micro-batch with
the step's normalisers and ``optimizer_step`` once, so DeepSpeed runs with ``gradient_accumulation_steps=1``
(no rescaling of the loss) and ``managed_gradient_accumulation=false`` (``engine.step()`` is the boundary,
whatever the number of micro-batches), with the micro-batches' gradients summed in float32 whatever the module's
dtype (``data_types.grad_accum_dtype``; a bf16 module's gradients are bf16 each, their sum is not). DeepSpeed averages gradients over ranks; ``step_totals`` therefore
returns the step's totals over all ranks / world, which makes the result exactly the gradient of the one
big batch (also for ``token_mean``, where ranks hold different numbers of tokens). The learning rate is set
by the loop before every step (no DeepSpeed scheduler), so the schedule never depends on accumulation.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from pods.backends.base import Backend, Sections, TokenStats, TrainBatch
from pods.errors import ConfigError
from pods.models import load_policy
from pods.schema import Hardware, Optim, Root


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in (extra or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def ds_config(hw: Hardware, o: Optim) -> dict:
    """The DeepSpeed config for this run (a plain dict; ``hardware.deepspeed.config`` is merged in last), from the
    hardware and optim sections (``DeepSpeedBackend.check`` has checked them)."""
    d = hw.deepspeed
    zero = {"stage": d.stage, "overlap_comm": d.overlap_comm, "contiguous_gradients": True}
    if d.stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True  # save_pretrained gathers the full weights
    for part in ("optimizer", "param"):
        device = getattr(d, f"offload_{part}")
        if device:
            zero[f"offload_{part}"] = {"device": device, "pin_memory": True}
    conf = {
        "train_micro_batch_size_per_gpu": int(hw.micro_batch_size),
        "gradient_accumulation_steps": 1,  # the loop accumulates (Backend.update): DeepSpeed must not rescale
        "managed_gradient_accumulation": False,  # engine.step() is the accumulation boundary
        "gradient_clipping": float(o.max_grad_norm or 0.0),
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": float(o.lr),
                "betas": list(o.betas),
                "eps": float(o.eps),
                "weight_decay": float(o.weight_decay),
                "torch_adam": _torch_adam(hw),
            },
        },
        "bf16": {"enabled": hw.dtype == "bfloat16"},
        "fp16": {"enabled": hw.dtype == "float16"},
        # micro-batch gradients summed in float32 (DeepSpeed's default is the module's dtype: bf16 sums would round
        # GRPO-GA's 16 micro-batches and PODS's 4 differently, the comparison the paper is about)
        "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    return _merge(conf, d.config)


def _torch_adam(hw: Hardware) -> bool:
    """torch's AdamW unless the profile asks for FusedAdam, which needs nvcc (a CUDA toolkit) to JIT-build on GPUs: a
    check of the machine the backend starts on (a login node that validates a sweep may have no nvcc), so here."""
    import os
    import shutil

    torch_adam = hw.deepspeed.torch_adam
    no_nvcc = shutil.which("nvcc") is None and not os.path.exists(os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", "nvcc"))
    if not torch_adam and hw.device == "cuda" and no_nvcc:
        raise ConfigError(
            "hardware.deepspeed.torch_adam=false: DeepSpeed's FusedAdam is JIT-built with nvcc at start-up and no CUDA toolkit "
            "was found (nvcc not on PATH, CUDA_HOME unset): set hardware.deepspeed.torch_adam=true or install nvcc of torch's CUDA"
        )
    return torch_adam


def _layer_of(name: str) -> str:
    """The block a parameter belongs to: up to its first numeric component (``model.layers.3``), else its module."""
    m = re.match(r"^(.*?\.\d+)\.", name)
    return m.group(1) if m else name.rsplit(".", 1)[0]


class DeepSpeedBackend(Backend):
    """``hardware.backend=deepspeed``: full fine-tuning, ZeRO-2/3 over the process group ``pods.distributed`` made."""

    sharded = True  # pods.checkpoint saves and loads it by save_sharded / load_sharded

    @classmethod
    def partition(cls, hw) -> tuple[int, int]:
        return int(hw.nproc_per_node), hw.deepspeed.stage

    def __init__(self, model_dir: str, cfg: Root | Sections):
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        from transformers.integrations import HfDeepSpeedConfig

        super().__init__(model_dir, cfg)
        self.config = ds_config(self.hw, self.optim_cfg)
        self.stage = self.config["zero_optimization"]["stage"]
        self.collective_forward = self.stage == 3
        if not hasattr(deepspeed.DeepSpeedEngine, "managed_gradient_accumulation"):  # new in 2026 (0.19.x)
            raise RuntimeError(
                f"deepspeed {deepspeed.__version__} lacks managed_gradient_accumulation, needed for exact accumulation: use >=0.19.8"
            )
        if not torch.distributed.is_initialized():
            raise RuntimeError("DeepSpeedBackend needs a process group: pods.distributed.init(hardware) creates it (hardware.dist_backend)")
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())  # adopts the group pods.distributed made
        self.rank = torch.distributed.get_rank()
        self.device = torch.device(get_accelerator().current_device_name())
        # Kept alive on purpose: from_pretrained then partitions weights while loading (ZeRO-3), and HF
        # generate() keeps ranks in step (synced_gpus) when it runs on the partitioned module.
        self._hf_ds_config = HfDeepSpeedConfig(self.config)
        model = load_policy(model_dir, self.hw)
        params = [p for p in model.parameters() if p.requires_grad]
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=self.config)
        self.ref = self._reference(model_dir) if self.alg.beta > 0 else None

    @classmethod
    def check(cls, cfg: Root) -> None:
        """Full fine-tuning with DeepSpeed's AdamW (ZeRO's stage is the schema's: 2 or 3)."""
        hw, o = cfg.hardware, cfg.optim
        if hw.finetune != "full":
            raise ConfigError("hardware.backend=deepspeed does full fine-tuning: set hardware.finetune=full (LoRA: hardware=l40s_lora)")
        if o.name != "adamw":
            raise ConfigError(f"hardware.backend=deepspeed uses DeepSpeed's AdamW: optim.name must be 'adamw', got '{o.name}'")

    def _reference(self, model_dir: str):
        """The frozen initial policy for the KL term: partitioned like the policy under ZeRO-3 (no optimizer)."""
        import deepspeed

        ref = load_policy(model_dir, self.hw.model_copy(update={"gradient_checkpointing": False})).requires_grad_(False).eval()
        if self.stage < 3:
            return ref.to(self.device)
        conf = {k: v for k, v in self.config.items() if k not in ("optimizer", "managed_gradient_accumulation", "gradient_clipping")}
        engine = deepspeed.initialize(model=ref, config=conf)[0]
        engine.eval()
        return engine

    @property
    def policy(self):
        """The HF module (partitioned under ZeRO-3: every forward gathers its layers from all ranks)."""
        return self.engine.module

    def step_totals(self, n_seqs: int, n_tokens: int) -> tuple[float, float]:
        totals = torch.tensor([n_seqs, n_tokens], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(totals)
        world = torch.distributed.get_world_size()
        return float(totals[0]) / world, float(totals[1]) / world

    def agree_count(self, count: int) -> int:
        top = torch.tensor([count], dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX)
        return int(top)

    def gap_totals(self, sums: torch.Tensor) -> torch.Tensor:
        total, top = sums[:-1].to(self.device), sums[-1:].to(self.device)
        torch.distributed.all_reduce(total)
        torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX)
        return torch.cat([total, top]).cpu()

    def forward_stats(self, mb: TrainBatch, entropy: bool = False) -> TokenStats:
        self.engine.train()
        return self.token_stats(self.engine, mb, entropy)

    @torch.no_grad()
    def ref_logprobs(self, mb: TrainBatch) -> torch.Tensor:
        return self.token_stats(self.ref, mb).logprobs

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def optimizer_step(self, lr: float) -> float:
        self.set_lr(self.optimizer, lr)
        self.engine.step()  # reduces, clips to gradient_clipping, steps AdamW, zeroes the gradients
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def export_weights(self):
        """Yield (HF name, full tensor) of the current policy for an engine's weight sync.

        ZeRO-3: gathered one block (embedding, decoder layer, norm, head) at a time, never the whole model;
        this is a collective, so every rank must consume the whole iterator. A tied head is yielded under both
        names (``model.embed_tokens.weight`` and ``lm_head.weight``), as in ``state_dict()``.
        """
        module = self.policy
        if self.stage < 3:
            yield from module.state_dict().items()
            return
        import deepspeed

        shared: dict[int, tuple[torch.nn.Parameter, list[str]]] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            shared.setdefault(id(p), (p, []))[1].append(name)
        blocks: dict[str, list] = {}
        for p, names in shared.values():
            blocks.setdefault(_layer_of(names[0]), []).append((p, names))
        for block in blocks.values():
            with deepspeed.zero.GatheredParameters([p for p, _ in block], modifier_rank=None):
                out = [(name, p.data.detach().clone()) for p, names in block for name in names]
            yield from out
        persistent = set(module.state_dict(keep_vars=True))
        for name, b in module.named_buffers():
            if name in persistent:
                yield name, b.detach().clone()

    def save_sharded(self, directory: Path) -> None:
        """Every rank writes its shard of the model and optimizer state into ``directory`` (collective)."""
        directory = Path(directory)
        self.engine.save_checkpoint(str(directory.parent), tag=directory.name, save_latest=False)

    def load_sharded(self, directory: Path) -> None:
        """Every rank reads its shard, unpickling no code: DeepSpeed 0.19.8 reads shards with
        ``torch.load(weights_only=False)``; here with ``weights_only=True`` and only DeepSpeed's plain state types
        allowed (ZeRO stage enum, loss-scaler state, ZeRO-2 fragment address: what its shards hold besides tensors)."""
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        def safe_load(engine, path: str, map_location=None):
            with torch.serialization.safe_globals([ZeroStageEnum, LossScaler, fragment_address]):
                return torch.load(path, map_location=map_location, weights_only=True)

        directory, unsafe = Path(directory), TorchCheckpointEngine.load
        TorchCheckpointEngine.load = safe_load
        try:
            path, _ = self.engine.load_checkpoint(str(directory.parent), tag=directory.name, load_lr_scheduler_states=False)
        finally:
            TorchCheckpointEngine.load = unsafe
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {directory}")

    def state_dict(self) -> dict:
        raise NotImplementedError("the DeepSpeed state is sharded: pods.checkpoint calls save_sharded/load_sharded")

    def load_state_dict(self, sd: dict) -> None:
        raise NotImplementedError("the DeepSpeed state is sharded: pods.checkpoint calls save_sharded/load_sharded")

    def save_pretrained(self, out_dir: str) -> None:
        """A consolidated HF model directory (rank 0 writes; a collective under ZeRO-3)."""
        if self.stage == 3:
            sd = self.engine._zero3_consolidated_16bit_state_dict()  # gathered layer by layer onto rank 0's CPU
        else:
            sd = {k: v.cpu() for k, v in self.policy.state_dict().items()}
        if self.rank == 0:
            self.policy.save_pretrained(out_dir, state_dict=sd)
        torch.distributed.barrier()
