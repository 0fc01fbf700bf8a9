# Moved here from pods/memory/__init__.py (issue 33): the package's __init__ now holds definitions only.
"""Peak GPU memory of a run, estimated from the resolved config and the model's config.json alone (no weights).

``estimate(cfg)`` -> ``Estimate``: the policy update's components per GPU (``pods.memory.update``), the rollout
engine's (its own model: ``Engine.memory``, e.g. vLLM's reservation or the in-process HF generation), and the total
against the card (``hardware.gpu_memory_gb``). ``check_fits(cfg)`` raises ``ConfigError`` in one line (the figure,
the card, the setting that fits) when a CUDA run cannot fit; ``pods.preflight`` calls it before any model loads.
GB = 1e9 bytes. docs/memory.md describes the model and what it leaves out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pods.architectures import model_config
from pods.engines import ENGINES
from pods.engines.memory import GB, Fix, Line, kv_bytes_per_token, largest, seq_tokens
from pods.memory.update import activation_lines, state_lines, step_temporaries
from pods.plan import largest_micro_batch
from pods.schema import Model, Root

__all__ = ["GB", "Estimate", "Line", "check_fits", "estimate", "kv_bytes_per_token", "largest_fitting", "refusal"]

CUDA_OVERHEAD_GB = 1.0  # CUDA context, cuBLAS/NCCL workspaces: memory outside PyTorch's allocator (per process)
ALLOCATOR_SLACK = 0.10  # the caching allocator's fragmentation on top of the trainer's tensor peak
log = logging.getLogger("pods.memory")
MARKS = {"sum": "", "max": " (max)", "info": " (info)"}


@dataclass
class Estimate:
    model: str
    hardware: str
    engine: str
    micro_batch: int
    tokens: int  # per sequence: prompt + completion budget
    update: list[Line]
    rollout: list[Line]
    update_gb: float  # the update's tensor peak: forward/backward of one micro-batch, or the optimizer step
    resident_gb: float  # what the trainer holds between updates (weights, optimizer state, ZeRO buffers)
    rollout_gb: float  # the engine's memory while the update runs (vLLM: its reservation)
    total_gb: float  # per GPU: CUDA overhead + the larger of (engine + update) and (generation + resident), with slack
    card_gb: float | None = None
    problems: list[str] = field(default_factory=list)  # what no micro-batch size fixes (vLLM's KV holds no sequence)

    @property
    def fits(self) -> bool | None:
        return None if self.card_gb is None else (self.total_gb <= self.card_gb and not self.problems)

    def gb(self, *names: str) -> float:
        return sum(ln.gb for ln in self.update + self.rollout if ln.name in names)

    def table(self) -> str:
        rows = [f"{self.model} on {self.hardware} ({self.engine}): micro-batch {self.micro_batch} x {self.tokens} tokens, per GPU"]
        for title, lines in (("update", self.update), ("rollout", self.rollout)):
            rows.append(f"  {title}")
            rows += [f"    {ln.name + MARKS[ln.kind]:<34} {ln.gb:8.2f} GB  {ln.note}" for ln in lines]
        card = "unknown (hardware.gpu_memory_gb)" if self.card_gb is None else f"{self.card_gb:g} GB"
        fits = {None: "", True: ": fits", False: ": DOES NOT FIT"}[self.fits]
        rows.append(f"  update peak {self.update_gb:.2f} GB, resident {self.resident_gb:.2f} GB, engine {self.rollout_gb:.2f} GB")
        rows.append(f"  total {self.total_gb:.2f} GB of {card}{fits}" + "".join(f"\n  problem: {p}" for p in self.problems))
        return "\n".join(rows)


def architecture(model: Model) -> dict:
    """The model's config.json fields: a local directory's, the table in pods.architectures, or the local HF cache's."""
    try:
        return model_config(model)
    except ValueError:
        import json

        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model.path), "config.json")
        if isinstance(cached, str):
            with open(cached) as f:
                return json.load(f)
        raise


def micro_batch(cfg: Root) -> int:
    """The run's largest micro-batch (its memory peak): ``pods.plan``'s plan at both ends of the run."""
    return largest_micro_batch(cfg.algorithm, cfg.train.prompts_per_step, cfg.hardware.micro_batch_size)


def estimate(cfg: Root, card: float | None = None) -> Estimate:
    """Per-GPU peak memory of ``cfg`` (the typed root); ``card`` GB, default ``hardware.gpu_memory_gb``. The engine's
    part is the engine's own model (``Engine.memory``)."""
    hw = cfg.hardware
    arch = architecture(cfg.model)
    card = hw.gpu_memory_gb if card is None else card
    states, acts = state_lines(cfg, arch), activation_lines(cfg, arch)
    update = [Line(name, b / GB, how) for name, b, how in states] + [Line(name, b / GB, how, kind) for name, b, how, kind in acts]
    resident = sum(b for name, b, _ in states if name != "gradients")
    grads = sum(b for name, b, _ in states if name == "gradients")
    step = step_temporaries(cfg, arch)
    update.append(Line("optimizer step temporaries", step / GB, "the step's peak: resident + gradients + these", "info"))
    saved, transient = sum(b for _, b, _, k in acts if k == "sum"), max(b for _, b, _, k in acts if k == "max")
    peak = max(resident + grads + saved + transient, resident + grads + step) / GB
    slack, overhead = 1 + ALLOCATOR_SLACK, CUDA_OVERHEAD_GB if hw.device == "cuda" else 0.0
    update.append(Line("CUDA overhead", overhead, f"context and workspaces; tensors x {slack:.2f} for fragmentation", "info"))
    engine = ENGINES.get(cfg.rollout.name).memory(cfg, arch, card)
    return Estimate(
        model=cfg.model.path or cfg.model.name,
        hardware=hw.name,
        engine=cfg.rollout.name,
        micro_batch=micro_batch(cfg),
        tokens=sum(seq_tokens(cfg)),
        update=update,
        rollout=engine.lines,
        update_gb=peak,
        resident_gb=resident / GB,
        rollout_gb=engine.held_gb,
        total_gb=overhead + engine.total(peak, resident / GB, slack),
        card_gb=card,
        problems=engine.problems,
    )


def changed(cfg: Root, section: str, key: str, value) -> Root:
    """A copy of ``cfg`` with ``<section>.<key> = value`` (not validated: a probe of the estimate)."""
    out = cfg.model_copy(deep=True)
    setattr(getattr(out, section), key, value)
    return out


def largest_fitting(cfg: Root, card: float, section: str, key: str, hi: int) -> int | None:
    """The largest v = 1 ... hi with which ``cfg`` fits ``card`` (the estimate grows with v), or None."""
    return largest(lambda v: bool(estimate(changed(cfg, section, key, v), card).fits), hi)


def refusal(cfg: Root, est: Estimate) -> str:
    """One line: the figure, the card, and the setting(s) with which the run fits, cheapest first (``lines.Fix``)."""
    hw, card = cfg.hardware, est.card_gb
    head = (
        f"hardware.micro_batch_size={hw.micro_batch_size} ({est.micro_batch} x {est.tokens} tokens) needs about {est.total_gb:.0f} GB "
        f"per GPU (update {est.update_gb:.1f} GB, {est.engine} {est.rollout_gb:.1f} GB) but the card has {card:g} GB (hardware.gpu_memory_gb)"
    )
    if est.problems:
        return f"{head}: {est.problems[0]}"

    def fits(section: str, key: str, value) -> bool:
        return bool(estimate(changed(cfg, section, key, value), card).fits)

    fixes: list[Fix] = []
    mbs = largest_fitting(cfg, card, "hardware", "micro_batch_size", est.micro_batch - 1)
    if mbs:
        fixes.append((0, f"hardware.micro_batch_size={mbs} fits"))
    for key, value in (("gradient_checkpointing", True), ("logprob_chunk_tokens", 2048)):
        if not getattr(hw, key) and fits("hardware", key, value):
            fixes.append((2, f"hardware.{key}={str(value).lower()} fits"))
    fixes += ENGINES.get(cfg.rollout.name).memory_fixes(cfg, fits)
    fix = "; ".join(text for _, text in sorted(fixes, key=lambda f: f[0]))
    fix = fix or "no single setting fits: use LoRA (hardware=l40s_lora), more GPUs or a larger card"
    return f"{head}: {fix} (python -m pods.memory <overrides> prints the estimate)"


def check_fits(cfg: Root, card: float | None = None) -> None:
    """Refuse a CUDA run whose estimate exceeds the card: ``ConfigError``, one line. ``card`` GB defaults to
    ``hardware.gpu_memory_gb``; a CPU run, an unknown card or an unknown architecture is not checked."""
    from pods.errors import ConfigError

    card = cfg.hardware.gpu_memory_gb if card is None else card
    if cfg.hardware.device != "cuda" or card is None:
        return
    try:
        est = estimate(cfg, card)
    except ValueError as e:  # a hub model not in pods.architectures nor in the local cache, an engine without a memory model
        log.warning(f"memory not estimated: {e}")
        return
    if not est.fits:
        raise ConfigError(refusal(cfg, est))
