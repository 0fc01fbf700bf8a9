"""A memory estimate's vocabulary and the engines' memory models (``Engine.memory``, read by ``pods.memory``).

The vocabulary, which the estimator (``pods.memory.estimator``), the policy update's model (``pods.memory.update``)
and every engine's memory model speak: a ``Line`` per component, an engine's ``EngineMemory``, the sequence the run
budgets for, and the search for the largest setting that fits. It sits with the engines, below ``pods.memory``, so
that the engines never import the estimator that asks them. The models: in-process generation with the training
module (``hf``, ``sparse_hf``) and vLLM's reservation. Numbers only: nothing here imports torch or vLLM, so the
estimate of a GPU run is made anywhere. GB = 1e9 bytes. docs/memory.md describes the model and what it leaves out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pods.architectures import head_dim, parameter_count

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


# -- the engines' memory models ---------------------------------------------------------------------------------------
# vLLM's memory outside its weights, activations and KV cache. CUDA graphs (on by default on GPU) are not in it: vLLM 0.32
# profiles their memory inside gpu_memory_utilization (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, its default), so they
# shrink the KV cache line (info), not the reservation the total counts.
VLLM_NON_TORCH_GB = 0.5
# (sequences of a generation call, prompt tokens, completion tokens) -> (sequences, tokens each keeps in its KV cache)
Cache = Callable[[int, int, int], tuple[int, int]]


def dense(seqs: int, prompt: int, completion: int) -> tuple[int, int]:
    """A dense cache: every sequence keeps its prompt and its completion."""
    return seqs, prompt + completion


def generation(cfg, arch: dict, cache: Cache = dense) -> EngineMemory:
    """In-process generation with the training module, on top of the trainer's resident state (``cfg``: the typed root).

    A call generates ``max_batch // n`` prompts x n (training) or ``max_batch // repeats`` x repeats (evaluation)
    sequences, whose KV cache ``cache`` sizes (dense for hf; sparse_hf's holds at most max(budget, prompt) tokens);
    the engine takes each token's log-prob as it goes, so one step's [sequences, V] logits are alive (3 fp32 copies:
    the scores, their log-softmax, a warper's). The prompt's prefill: one layer's intermediates per token."""
    ro, s, ev, alg = cfg.rollout, cfg.sampling, cfg.eval, cfg.algorithm
    a = 4 if cfg.model.quantization == "4bit" else DTYPE_BYTES[cfg.hardware.dtype]
    H, F, V = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    p_len, per_tok, n, r = seq_tokens(cfg)[0], kv_bytes_per_token(arch, a), alg.n, ev.repeats
    calls = [
        (n * min(cfg.train.prompts_per_step, max(1, ro.max_batch // n)), s.max_tokens),
        (r * max(1, ro.max_batch // r), ev.max_tokens),
    ]
    worst = None
    for seqs, c_len in calls:
        seqs, kv_tokens = cache(seqs, p_len, c_len)
        kv = seqs * kv_tokens * per_tok
        logits, prefill = seqs * V * 4 * 3, seqs * p_len * (3 * F + 4 * H) * a
        if worst is None or kv + max(prefill, logits) > worst[0]:
            worst = (kv + max(prefill, logits), seqs, kv, logits, prefill)
    total, seqs, kv, logits, prefill = worst
    lines = [
        Line(f"{ro.name} KV cache", kv / GB, f"{seqs} sequences x {per_tok / 1e3:.0f} kB/token"),
        Line(f"{ro.name} logits", logits / GB, f"one step's [{seqs}, {V}] fp32 copies", "max"),
        Line(f"{ro.name} prefill", prefill / GB, f"{seqs} x {p_len} prompt tokens, one layer", "max"),
    ]
    return EngineMemory(lines, total / GB)


def fewer_sequences(cfg, fits: Fits) -> list[Fix]:
    """In-process generation: the largest ``rollout.max_batch`` (sequences per call) that fits."""
    mb = largest(lambda v: fits("rollout", "max_batch", v), cfg.rollout.max_batch - 1)
    return [(3, f"rollout.max_batch={mb} fits")] if mb else []


def vllm(cfg, arch: dict, card: float | None, max_model_len: int | None) -> EngineMemory:
    """vLLM's reservation: ``gpu_memory_utilization`` x the card (vLLM sizes its KV cache as that share minus its
    weights, profiled activations and non-torch memory; what the trainer holds is not counted in it), or weights +
    workspace + ``kv_cache_gib``. Weights: the whole model in ``rollout.dtype`` (a 4-bit base is served in bf16).
    Workspace: max_num_batched_tokens (vLLM's default for ``LLM``: 16384 on >= 70 GiB cards other than A100, else
    8192) x one layer's intermediates, and the sampler's [max_num_seqs, V] fp32 copies. Sleep mode frees weights and
    KV cache during the update. ``max_model_len``: the engine's (``pods.engines.vllm.context_length``; None: the
    model's context)."""
    ro, hw = cfg.rollout, cfg.hardware
    d = DTYPE_BYTES[ro.dtype]
    H, F, V, P = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"], parameter_count(arch)
    big = card is not None and card * GB >= 70 * (1 << 30) and "a100" not in hw.name
    mnbt = int(ro.extra_args.get("max_num_batched_tokens") or (16384 if big else 8192))
    weights, work = P * d, mnbt * (3 * F + 4 * H) * d + ro.max_num_seqs * V * 4 * 3 + VLLM_NON_TORCH_GB * GB
    per_tok = kv_bytes_per_token(arch, d)
    mml = max_model_len or int(arch["max_position_embeddings"])
    lines = [
        Line("vLLM weights", weights / GB, f"{P / 1e9:.2f}B x {d} B"),
        Line("vLLM workspace", work / GB, f"{mnbt} batched tokens + sampler"),
    ]
    if ro.kv_cache_gib:
        kv = ro.kv_cache_gib * (1 << 30)
        reserved, how = weights + work + kv, f"weights + workspace + kv_cache_gib={ro.kv_cache_gib}"
    elif card is None:
        return EngineMemory(lines, 0.0, 0.0)
    else:
        reserved = ro.gpu_memory_utilization * card * GB
        kv, how = reserved - weights - work, f"gpu_memory_utilization {ro.gpu_memory_utilization} x {card:g} GB"
    seqs = max(kv, 0) / (mml * per_tok)
    lines.append(Line("vLLM KV cache", max(kv, 0) / GB, f"{per_tok / 1e3:.0f} kB/token: {seqs:.0f} sequences of {mml} tokens", "info"))
    lines.append(Line("vLLM reservation", reserved / GB, how))
    problems = []
    if seqs < 1:
        need = (
            f"rollout.gpu_memory_utilization >= {(weights + work + mml * per_tok) / GB / card:.2f}"
            if not ro.kv_cache_gib
            else "more rollout.kv_cache_gib"
        )
        problems.append(
            f"vLLM's {reserved / GB:.1f} GB hold its weights and workspace ({(weights + work) / GB:.1f} GB) but no {mml}-token sequence: {need}"
        )
    if ro.enable_sleep_mode:
        lines.append(Line("freed by sleep mode", (reserved - work) / GB, "weights to CPU RAM, KV cache dropped during the update", "info"))
    return EngineMemory(lines, (work if ro.enable_sleep_mode else reserved) / GB, reserved / GB, problems)


def smaller_share(cfg, fits: Fits) -> list[Fix]:
    """vLLM sized by a share of the card: the largest ``rollout.gpu_memory_utilization`` below it (in 0.05 steps) that
    fits (too small a share holds no KV: the estimate says so)."""
    ro = cfg.rollout
    if ro.kv_cache_gib:
        return []
    shares = [k / 20 for k in range(round(ro.gpu_memory_utilization * 20) - 1, 0, -1)]
    u = next((x for x in shares if fits("rollout", "gpu_memory_utilization", x)), None)
    return [(1, f"rollout.gpu_memory_utilization={u:.2f} fits")] if u else []
