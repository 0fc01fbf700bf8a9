"""What a backend is (the update: ``pods.backends.updater``; the batch: ``pods.backends.batch``).

``Backend`` is a whole plug-in (``BACKENDS``): the update (``Updater``) plus the policy it holds (``policy``,
``export_weights``, ``save_pretrained``, ``state_dict``), its own rules (``check``, called by ``pods.config.validate``)
and the sections it reads (``Sections``: model, hardware, algorithm, optim). Adding a backend is one module and one
``BACKENDS.register_lazy`` line. The optimizers a profile may name are registered here (``OPTIMIZERS``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from pods.backends.batch import TokenStats, TrainBatch, build_batch, token_stats
from pods.backends.gap import GapCheck
from pods.backends.updater import Updater, loss_temperature
from pods.registry import Registry
from pods.schema import Algorithm, Hardware, Model, Optim, Root

__all__ = [  # the batch's names are public here too (``pods.backends.base.build_batch``)
    "BACKENDS",
    "OPTIMIZERS",
    "Backend",
    "Sections",
    "TokenStats",
    "TrainBatch",
    "Updater",
    "build_batch",
    "loss_temperature",
    "token_stats",
]

BACKENDS = Registry("training backend")
OPTIMIZERS = Registry("optimizer")


@OPTIMIZERS.register("adamw")
def adamw(params, o: Optim):
    return torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)


@OPTIMIZERS.register("adamw_8bit")
def adamw_8bit(params, o: Optim):  # the authors' single-GPU optimizer; needs bitsandbytes and a GPU
    import bitsandbytes as bnb

    return bnb.optim.AdamW8bit(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)


@dataclass(frozen=True)
class Sections:
    """What a backend reads of a run's config: its four sections, the loss's temperature (``loss_temperature``) and what
    the sampler gap measures (``pods.backends.gap``)."""

    model: Model
    hardware: Hardware
    algorithm: Algorithm
    optim: Optim
    temperature: float = 1.0
    gap: GapCheck = field(default_factory=GapCheck)  # what the sampler gap measures in this run
    norm_tokens: int = 1  # loss_agg seq_mean_token_sum_norm's constant (algorithm.loss_norm_tokens or sampling.max_tokens)

    @classmethod
    def of(cls, cfg: Root) -> Sections:
        norm = cfg.algorithm.loss_norm_tokens or cfg.sampling.max_tokens
        return cls(cfg.model, cfg.hardware, cfg.algorithm, cfg.optim, loss_temperature(cfg.algorithm, cfg.sampling), GapCheck.of(cfg), norm)


class Backend(Updater, ABC):
    """A training backend: the policy (``policy``, the module an in-process engine generates with), its optimizer and
    the update's hooks. Built as ``cls(model_dir, cfg)``: ``cfg`` is the typed root (checked by ``pods.config.validate``,
    which runs ``check``) or its ``Sections``; the backend keeps only the sections (``model_cfg``, ``hw``, ``alg``,
    ``optim_cfg``). ``collective_forward``: every forward is a collective over ranks (ZeRO-3), so ranks run them in
    lockstep. ``sharded``: its state is sharded over ranks (DeepSpeed), saved and loaded by its ``save_sharded``/
    ``load_sharded``, which ``pods.checkpoint`` calls instead of ``state_dict``/``load_state_dict``; ``partition``
    says over how many ranks and how (the memory estimate reads it)."""

    collective_forward: bool = False
    sharded: bool = False

    def __init__(self, model_dir: str, cfg: Root | Sections):
        if not isinstance(cfg, Sections):
            cfg = Sections.of(cfg)
        self.model_dir = model_dir  # the base the policy was loaded from (what a LoRA final/ needs)
        self.model_cfg, self.hw, self.alg, self.optim_cfg = cfg.model, cfg.hardware, cfg.algorithm, cfg.optim
        self.micro_batch_size = cfg.hardware.micro_batch_size
        self.micro_batch_tokens = cfg.hardware.micro_batch_tokens
        self.temperature = cfg.temperature
        self.gap_check = cfg.gap
        self.norm_tokens = cfg.norm_tokens
        self.chunk_tokens = cfg.hardware.logprob_chunk_tokens  # rows per chunk of the loss's log-softmax

    @classmethod
    def partition(cls, hw: Hardware) -> tuple[int, int]:
        """(ranks the training state is partitioned over, ZeRO stage: 0 = each rank holds all of it), for ``hw``."""
        return 1, 0

    @classmethod
    def check(cls, cfg: Root) -> None:
        """Rules this backend adds across sections (``cfg``: the typed root), before anything loads; ``ConfigError``
        in one line naming the key."""
        return None

    def token_stats(self, model, mb: TrainBatch, entropy: bool = False) -> TokenStats:
        """Completion-token log-probs (and entropies) of ``model`` on ``mb``, via the chunked head (no [B, T, V] logits)."""
        return token_stats(model, mb, self.temperature, self.chunk_tokens, entropy)

    @staticmethod
    def set_lr(optimizer, lr: float) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr

    @property
    @abstractmethod
    def policy(self):
        """The HF module being trained (an in-process engine generates with it)."""

    @abstractmethod
    def forward_stats(self, mb: TrainBatch, entropy: bool = False) -> TokenStats:
        """The policy's stats of ``mb`` with grad (training mode)."""

    @abstractmethod
    def ref_logprobs(self, mb: TrainBatch) -> torch.Tensor:
        """The frozen reference policy's log-probs of ``mb`` (the KL term), no grad."""

    @abstractmethod
    def optimizer_step(self, lr: float) -> float:
        """One optimizer step at ``lr`` on the accumulated gradients (clipped to ``optim.max_grad_norm``); the
        pre-clip global gradient norm."""

    @abstractmethod
    def export_weights(self):
        """Yield (HF name, full tensor) of the current policy, for an engine's weight sync (``Engine.load_weights``)."""

    @abstractmethod
    def save_pretrained(self, out_dir: str) -> None:
        """The policy as a model directory (``train.checkpoint_at_end=weights``, ``train.save_final``)."""

    def save_final(self, out_dir: str, tok) -> None:
        """``final/``: a complete model directory, the policy (``save_pretrained``: full weights, or a LoRA adapter)
        with its tokenizer and chat template, so ``pods-eval RUN/final`` and ``from_pretrained`` load it alone. An
        adapter's ``adapter_config.json`` names the base it goes over (``base_model_name_or_path``: the directory the
        run loaded), and ``pods_final.json`` says so in words."""
        import json
        from pathlib import Path

        self.save_pretrained(out_dir)  # a collective under ZeRO-3; rank 0 writes
        if self.rank != 0:
            return
        out = Path(out_dir)
        tok.save_pretrained(out_dir)
        for marker in ("pods_tiny.json",):  # how pods.models.load_tokenizer knows a pods-built tokenizer
            if (Path(self.model_dir) / marker).is_file():
                (out / marker).write_bytes((Path(self.model_dir) / marker).read_bytes())
        adapter = out / "adapter_config.json"
        note = {"weights": "full", "base_model": None}
        chat = {"chat_template_kwargs": dict(self.model_cfg.chat_template_kwargs)}  # how the prompts were rendered (pods-eval reads it)
        if adapter.is_file():
            cfg = json.loads(adapter.read_text())
            cfg["base_model_name_or_path"] = str(self.model_dir)
            adapter.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            note = {
                "weights": "LoRA adapter",
                "base_model": str(self.model_dir),
                "load": "PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_model), this directory); "
                "pods-eval THIS_DIRECTORY does so",
            }
        (out / "pods_final.json").write_text(json.dumps(note | chat, indent=2) + "\n")

    @abstractmethod
    def state_dict(self) -> dict:
        """What a checkpoint holds of the backend (model + optimizer)."""

    @abstractmethod
    def load_state_dict(self, sd: dict) -> None:
        """Restore what ``state_dict`` returned (a resumed run)."""
