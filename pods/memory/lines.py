"""The vocabulary of a memory estimate, shared by the estimator (``pods.memory``) and the plug-ins that bring their
own lines (every rollout engine's ``Engine.memory``): a ``Line`` per component, an engine's ``EngineMemory``, the
sequence the run budgets for, and the search for the largest setting that fits. GB = 1e9 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pods.architectures import head_dim

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# fits(section, key, value): whether the run fits its card with ``<section>.<key> = value`` (the estimator's probe)
Fits = Callable[[str, str, Any], bool]
# A suggested setting for a run that does not fit: (order, "key=value fits"); the refusal lists the cheapest first:
# 0 the micro-batch, 1 an engine's share of the card, 2 recomputation (checkpointing, loss chunks), 3 slower generation
Fix = tuple[int, str]


@dataclass
class Line:
    """One component: ``gb`` per GPU; ``kind`` "sum" (adds to the peak), "max" (the largest of these adds) or "info"."""

    name: str
    gb: float
    note: str = ""
    kind: str = "sum"


@dataclass
class EngineMemory:
    """A rollout engine's part of one GPU's memory.

    ``held_gb``: what the engine holds while the policy update runs: its own reservation (vLLM's, or its workspace
    when asleep), or, for an engine that generates with the training module, what one generation call adds on top of
    the trainer's resident state. ``reserved_gb``: an engine with a reservation of its own (outside the trainer's
    caching allocator): its size while generating; None for an engine whose tensors go through the trainer's allocator.
    """

    lines: list[Line]
    held_gb: float
    reserved_gb: float | None = None
    problems: list[str] = field(default_factory=list)  # what no micro-batch size fixes (vLLM's KV holds no sequence)

    def total(self, peak: float, resident: float, slack: float) -> float:
        """GB per GPU before the CUDA overhead: the larger of (engine + update peak) and (generation + resident);
        ``slack`` (the allocator's fragmentation) multiplies what the trainer's allocator holds."""
        if self.reserved_gb is None:
            return max(peak, resident + self.held_gb) * slack
        return max(self.held_gb + peak * slack, self.reserved_gb + resident * slack)


def kv_bytes_per_token(arch: dict, dtype_bytes: int) -> int:
    """Keys + values of every layer for one token."""
    return 2 * arch["num_hidden_layers"] * arch["num_key_value_heads"] * head_dim(arch) * dtype_bytes


def seq_tokens(cfg) -> tuple[int, int]:
    """(prompt, completion) tokens of the longest sequence of ``cfg`` (the typed root): dataset.max_prompt_length
    (else an engine's sequence budget, ``rollout.max_model_len``, minus the completion, else 512: assumed) and
    sampling.max_tokens."""
    c = int(cfg.sampling.max_tokens)
    p = cfg.dataset.max_prompt_length
    if p is None:
        mml = getattr(cfg.rollout, "max_model_len", None)
        p = int(mml) - c if mml else 512
    return int(p), c


def largest(fits: Callable[[int], bool], hi: int) -> int | None:
    """The largest v = 1 ... hi with ``fits(v)`` (``fits`` turns false as v grows), or None."""
    lo = 1
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
