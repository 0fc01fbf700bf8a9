"""Single-process training: full fine-tuning or LoRA (peft) on one device.

The LoRA reference policy is the same module with its adapter disabled; full fine-tuning keeps a frozen
copy of the initial weights only when a KL term is used (beta > 0).
"""

from __future__ import annotations

import copy

import torch

from pods.backends.base import OPTIMIZERS, Backend, Sections, TokenStats, TrainBatch
from pods.models import load_policy, unwrap
from pods.schema import Hardware, Root


def is_quantized(p: torch.Tensor) -> bool:
    """A bitsandbytes weight that holds packed codes, not values (4-bit NF4 ``Params4bit``, 8-bit ``Int8Params``)."""
    return type(p).__name__ in ("Params4bit", "Int8Params")


def dequantise(module: torch.nn.Module) -> torch.Tensor:
    from peft.utils.integrations import dequantize_module_weight

    return dequantize_module_weight(module)


def exported_weight(modules: dict, name: str, p: torch.Tensor) -> torch.Tensor:
    """The value vLLM must load for parameter ``name`` (peft naming) of a LoRA model: dequantised when packed,
    plus every active adapter's ``scale * B @ A`` when its layer is a LoRA target, summed in float32 and returned in
    float32: the engine rounds it to its own dtype once (a bf16 sum here would drop every delta under half a bf16 ulp
    of W even for a float32 engine: results/cpu/merge_lag/). ``modules``: name -> module."""
    owner_name, leaf = name.rsplit(".", 1)
    w = dequantise(modules[owner_name]) if is_quantized(p) else p.detach()
    lora = modules.get(owner_name.removesuffix(".base_layer")) if owner_name.endswith(".base_layer") else None
    if leaf == "weight" and lora is not None and hasattr(lora, "get_delta_weight"):
        return sum((lora.get_delta_weight(a).float() for a in lora.active_adapters), w.float())
    return w.to(p.dtype) if p.is_floating_point() else w


def with_lora(model, hw: Hardware, quantization: str | None):
    """``model`` under a fresh peft LoRA adapter of ``hw.lora`` (a 4-bit base prepared for k-bit training first)."""
    from peft import LoraConfig, get_peft_model

    lc = hw.lora
    if quantization:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=hw.gradient_checkpointing)
    targets = lc.target_modules if isinstance(lc.target_modules, str) else list(lc.target_modules)  # a str: peft's "all-linear"
    config = LoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout, target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


class LocalBackend(Backend):
    """``hardware.backend=local``: one process, one device; LoRA (peft, optionally on a 4-bit NF4 base) or full
    fine-tuning, with the optimizer ``optim.name`` names (``OPTIMIZERS``)."""

    def __init__(self, model_dir: str, cfg: Root | Sections):
        super().__init__(model_dir, cfg)
        hw, quant = self.hw, self.model_cfg.quantization
        self.device = torch.device(hw.device)
        self.lora = hw.finetune == "lora"
        model = load_policy(model_dir, hw, quantization=quant)
        if not quant:
            model = model.to(self.device)
        self.ref = None
        if self.lora:
            model = with_lora(model, hw, quant)
        elif self.alg.beta > 0:
            self.ref = copy.deepcopy(model).eval().requires_grad_(False)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = OPTIMIZERS.get(self.optim_cfg.name)(self.params, self.optim_cfg)

    @property
    def policy(self):
        """The module the HF engine generates with."""
        return self.model

    def forward_stats(self, mb: TrainBatch, entropy: bool = False) -> TokenStats:
        self.model.train()
        return self.token_stats(self.model, mb, entropy)

    @torch.no_grad()
    def ref_logprobs(self, mb: TrainBatch) -> torch.Tensor:
        if self.lora:
            with self.model.disable_adapter():
                return self.token_stats(self.model, mb).logprobs
        return self.token_stats(self.ref, mb).logprobs

    def optimizer_step(self, lr: float) -> float:
        self.set_lr(self.optimizer, lr)
        max_norm = self.optim_cfg.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm if max_norm else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    @torch.no_grad()
    def export_weights(self):
        """Yield (HF name, tensor) of the full current policy, for engines that need a sync.

        LoRA: W + scale * B @ A is computed OUT of place (the base weights are never merged and unmerged,
        which in bf16 would drift a little every step). A 4-bit base is dequantised layer by layer, in AND
        outside ``target_modules`` (a packed uint8 NF4 weight is meaningless to vLLM). Tied embeddings yield
        ``lm_head.weight`` too.
        """
        if not self.lora:
            yield from self.model.state_dict().items()
            return
        base = unwrap(self.model)
        modules = dict(base.named_modules())
        for name, p in base.named_parameters(remove_duplicate=False):
            if "lora_" not in name:
                yield name.replace(".base_layer", ""), exported_weight(modules, name, p)

    def state_dict(self) -> dict:
        model_sd = {k: v for k, v in self.model.state_dict().items() if not self.lora or "lora_" in k}
        return {"model": model_sd, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        missing, unexpected = self.model.load_state_dict(sd["model"], strict=False)
        if unexpected:
            raise ValueError(f"checkpoint has unexpected keys: {unexpected[:5]}")
        self.optimizer.load_state_dict(sd["optimizer"])

    def save_pretrained(self, out_dir: str) -> None:
        self.model.save_pretrained(out_dir)
