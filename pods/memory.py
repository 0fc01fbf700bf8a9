"""Peak GPU memory of a run, estimated from the resolved config and the model's config.json alone (no weights).

``estimate(cfg)`` -> ``Estimate``: the policy update's components per GPU (``pods.memory_update``), the rollout
engine's (vLLM's reservation, or the in-process HF generation), and the total against the card
(``hardware.gpu_memory_gb``). ``check_fits(cfg)`` raises ``ConfigError`` in one line (the figure, the card, the
setting that fits) when a CUDA run cannot fit; ``pods.preflight`` calls it before any model loads.
``python -m pods.memory <overrides>`` (``make memory ARGS=...``) prints the table; ``--all`` writes one row per
GPU experiment (``pods.memory_report``). GB = 1e9 bytes. docs/memory.md describes the model and what it leaves out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pods.architectures import head_dim, model_config, parameter_count
from pods.memory_update import DTYPE_BYTES, activation_lines, micro_batch, seq_tokens, state_lines, step_temporaries

GB = 1e9
CUDA_OVERHEAD_GB = 1.0  # CUDA context, cuBLAS/NCCL workspaces: memory outside PyTorch's allocator (per process)
ALLOCATOR_SLACK = 0.10  # the caching allocator's fragmentation on top of the trainer's tensor peak
VLLM_NON_TORCH_GB = 0.5  # vLLM's memory outside its weights, activations and KV cache (CUDA graphs off)
log = logging.getLogger("pods.memory")
MARKS = {"sum": "", "max": " (max)", "info": " (info)"}


@dataclass
class Line:
    """One component: ``gb`` per GPU; ``kind`` "sum" (adds to the peak), "max" (the largest of these adds) or "info"."""

    name: str
    gb: float
    note: str = ""
    kind: str = "sum"


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


def kv_bytes_per_token(arch: dict, dtype_bytes: int) -> int:
    """Keys + values of every layer for one token."""
    return 2 * arch["num_hidden_layers"] * arch["num_key_value_heads"] * head_dim(arch) * dtype_bytes


def vllm_lines(cfg: dict, arch: dict, card: float | None) -> tuple[list[Line], float, float, list[str]]:
    """vLLM's reservation: ``gpu_memory_utilization`` x the card (vLLM sizes its KV cache as that share minus its
    weights, profiled activations and non-torch memory; what the trainer holds is not counted in it), or weights +
    workspace + ``kv_cache_gib``. Returns (lines, GB while generating, GB during the update, problems). Weights: the
    whole model in ``rollout.dtype`` (a 4-bit base is served in bf16). Workspace: max_num_batched_tokens (vLLM's
    default for ``LLM``: 16384 on >= 70 GiB cards other than A100, else 8192) x one layer's intermediates, and the
    sampler's [max_num_seqs, V] fp32 copies. Sleep mode frees weights and KV cache during the update."""
    from pods.engines.vllm import context_length

    ro, hw = cfg["rollout"], cfg["hardware"]
    d = DTYPE_BYTES[ro["dtype"]]
    H, F, V, P = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"], parameter_count(arch)
    big = card is not None and card * GB >= 70 * (1 << 30) and "a100" not in hw["name"]
    mnbt = int(ro["extra_args"].get("max_num_batched_tokens") or (16384 if big else 8192))
    weights, work = P * d, mnbt * (3 * F + 4 * H) * d + ro["max_num_seqs"] * V * 4 * 3 + VLLM_NON_TORCH_GB * GB
    per_tok = kv_bytes_per_token(arch, d)
    mml = context_length(ro)  # the engine's max_model_len
    lines = [
        Line("vLLM weights", weights / GB, f"{P / 1e9:.2f}B x {d} B"),
        Line("vLLM workspace", work / GB, f"{mnbt} batched tokens + sampler"),
    ]
    if ro["kv_cache_gib"]:
        kv = ro["kv_cache_gib"] * (1 << 30)
        reserved, how = weights + work + kv, f"weights + workspace + kv_cache_gib={ro['kv_cache_gib']}"
    elif card is None:
        return lines, 0.0, 0.0, []
    else:
        reserved = ro["gpu_memory_utilization"] * card * GB
        kv, how = reserved - weights - work, f"gpu_memory_utilization {ro['gpu_memory_utilization']} x {card:g} GB"
    seqs = max(kv, 0) / (mml * per_tok)
    lines.append(Line("vLLM KV cache", max(kv, 0) / GB, f"{per_tok / 1e3:.0f} kB/token: {seqs:.0f} sequences of {mml} tokens", "info"))
    lines.append(Line("vLLM reservation", reserved / GB, how))
    problems = []
    if seqs < 1:
        need = (
            f"rollout.gpu_memory_utilization >= {(weights + work + mml * per_tok) / GB / card:.2f}"
            if not ro["kv_cache_gib"]
            else "more rollout.kv_cache_gib"
        )
        problems.append(
            f"vLLM's {reserved / GB:.1f} GB hold its weights and workspace ({(weights + work) / GB:.1f} GB) but no {mml}-token sequence: {need}"
        )
    if ro["enable_sleep_mode"]:
        lines.append(Line("freed by sleep mode", (reserved - work) / GB, "weights to CPU RAM, KV cache dropped during the update", "info"))
    return lines, reserved / GB, (work if ro["enable_sleep_mode"] else reserved) / GB, problems


def generation_lines(cfg: dict, arch: dict) -> tuple[list[Line], float]:
    """In-process generation with the training module (``hf``, ``sparse_hf``), on top of the trainer's resident state.

    hf: a ``generate`` call of ``max_batch // n`` prompts x n (training) or ``max_batch // repeats`` x repeats
    (evaluation) keeps a dense KV cache; its logits processor takes each token's log-prob as it goes, so one step's
    [sequences, V] logits are alive (3 fp32 copies: the scores, their log-softmax, a warper's). sparse_hf:
    ``max_batch`` sequences whose KV is at most max(budget, prompt) tokens, one step's logits. Both prefill the
    prompt: one layer's intermediates per token."""
    ro, s, ev, alg = cfg["rollout"], cfg["sampling"], cfg["eval"], cfg["algorithm"]
    a = 4 if cfg["model"]["quantization"] == "4bit" else DTYPE_BYTES[cfg["hardware"]["dtype"]]
    H, F, V = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    p_len, per_tok, n, r = seq_tokens(cfg)[0], kv_bytes_per_token(arch, a), alg["n"], ev["repeats"]
    calls = [
        (n * min(cfg["train"]["prompts_per_step"], max(1, ro["max_batch"] // n)), s["max_tokens"]),
        (r * max(1, ro["max_batch"] // r), ev["max_tokens"]),
    ]
    worst = None
    for seqs, c_len in calls:
        if ro["name"] == "sparse_hf":
            seqs = min(ro["max_batch"], seqs)
            kv = seqs * max(ro["budget"], p_len) * per_tok
        else:
            kv = seqs * (p_len + c_len) * per_tok
        logits, prefill = seqs * V * 4 * 3, seqs * p_len * (3 * F + 4 * H) * a
        if worst is None or kv + max(prefill, logits) > worst[0]:
            worst = (kv + max(prefill, logits), seqs, kv, logits, prefill)
    total, seqs, kv, logits, prefill = worst
    name = ro["name"]
    lines = [
        Line(f"{name} KV cache", kv / GB, f"{seqs} sequences x {per_tok / 1e3:.0f} kB/token"),
        Line(f"{name} logits", logits / GB, f"one step's [{seqs}, {V}] fp32 copies", "max"),
        Line(f"{name} prefill", prefill / GB, f"{seqs} x {p_len} prompt tokens, one layer", "max"),
    ]
    return lines, total / GB


def architecture(model_cfg: dict) -> dict:
    """The model's config.json fields: a local directory's, the table in pods.architectures, or the local HF cache's."""
    try:
        return model_config(model_cfg)
    except ValueError:
        import json

        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model_cfg["path"]), "config.json")
        if isinstance(cached, str):
            with open(cached) as f:
                return json.load(f)
        raise


def estimate(cfg: dict, card: float | None = None) -> Estimate:
    """Per-GPU peak memory of ``cfg`` (completed by ``pods.schema.check``); ``card`` GB, default ``hardware.gpu_memory_gb``."""
    hw, ro = cfg["hardware"], cfg["rollout"]
    arch = architecture(cfg["model"])
    card = hw["gpu_memory_gb"] if card is None else card
    states, acts = state_lines(cfg, arch), activation_lines(cfg, arch)
    update = [Line(name, b / GB, how) for name, b, how in states] + [Line(name, b / GB, how, kind) for name, b, how, kind in acts]
    resident = sum(b for name, b, _ in states if name != "gradients")
    grads = sum(b for name, b, _ in states if name == "gradients")
    step = step_temporaries(cfg, arch)
    update.append(Line("optimizer step temporaries", step / GB, "the step's peak: resident + gradients + these", "info"))
    saved, transient = sum(b for _, b, _, k in acts if k == "sum"), max(b for _, b, _, k in acts if k == "max")
    peak = max(resident + grads + saved + transient, resident + grads + step) / GB
    slack, overhead = 1 + ALLOCATOR_SLACK, CUDA_OVERHEAD_GB if hw["device"] == "cuda" else 0.0
    update.append(Line("CUDA overhead", overhead, f"context and workspaces; tensors x {slack:.2f} for fragmentation", "info"))
    problems: list[str] = []
    if ro["name"] == "vllm":
        rollout, reserved, held, problems = vllm_lines(cfg, arch, card)
        total = overhead + max(held + peak * slack, reserved + resident / GB * slack)
    else:
        rollout, held = generation_lines(cfg, arch)
        total = overhead + max(peak, resident / GB + held) * slack
    return Estimate(
        model=cfg["model"]["path"] or cfg["model"]["name"],
        hardware=hw["name"],
        engine=ro["name"],
        micro_batch=micro_batch(cfg),
        tokens=sum(seq_tokens(cfg)),
        update=update,
        rollout=rollout,
        update_gb=peak,
        resident_gb=resident / GB,
        rollout_gb=held,
        total_gb=total,
        card_gb=card,
        problems=problems,
    )


def _with(cfg: dict, section: str, key: str, value) -> dict:
    return {**cfg, section: {**cfg[section], key: value}}


def largest_fitting(cfg: dict, card: float, section: str, key: str, hi: int) -> int | None:
    """The largest v = 1 ... hi with which ``cfg`` fits ``card`` (the estimate grows with v), or None."""

    def fits(v: int) -> bool:
        return bool(estimate(_with(cfg, section, key, v), card).fits)

    lo = 1
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def refusal(cfg: dict, est: Estimate) -> str:
    """One line: the figure, the card, and the setting(s) with which the run fits."""
    hw, ro, card = cfg["hardware"], cfg["rollout"], est.card_gb
    head = (
        f"hardware.micro_batch_size={hw['micro_batch_size']} ({est.micro_batch} x {est.tokens} tokens) needs about {est.total_gb:.0f} GB "
        f"per GPU (update {est.update_gb:.1f} GB, {est.engine} {est.rollout_gb:.1f} GB) but the card has {card:g} GB (hardware.gpu_memory_gb)"
    )
    if est.problems:
        return f"{head}: {est.problems[0]}"
    fixes = []
    mbs = largest_fitting(cfg, card, "hardware", "micro_batch_size", est.micro_batch - 1)
    if mbs:
        fixes.append(f"hardware.micro_batch_size={mbs} fits")
    if ro["name"] == "vllm" and not ro["kv_cache_gib"]:
        shares = [k / 20 for k in range(round(ro["gpu_memory_utilization"] * 20) - 1, 0, -1)]  # too small a share holds no KV
        u = next((x for x in shares if estimate(_with(cfg, "rollout", "gpu_memory_utilization", x), card).fits), None)
        if u:
            fixes.append(f"rollout.gpu_memory_utilization={u:.2f} fits")
    for key, value in (("gradient_checkpointing", True), ("logprob_chunk_tokens", 2048)):
        if not hw[key] and estimate(_with(cfg, "hardware", key, value), card).fits:
            fixes.append(f"hardware.{key}={str(value).lower()} fits")
    if ro["name"] in ("hf", "sparse_hf"):  # in-process generation: its KV cache grows with the sequences per call
        mb = largest_fitting(cfg, card, "rollout", "max_batch", ro["max_batch"] - 1)
        if mb:
            fixes.append(f"rollout.max_batch={mb} fits")
    fix = "; ".join(fixes) or "no single setting fits: use LoRA (hardware=l40s_lora), more GPUs or a larger card"
    return f"{head}: {fix} (python -m pods.memory <overrides> prints the estimate)"


def check_fits(cfg: dict, card: float | None = None) -> None:
    """Refuse a CUDA run whose estimate exceeds the card: ``ConfigError``, one line. ``card`` GB defaults to
    ``hardware.gpu_memory_gb``; a CPU run, an unknown card or an unknown architecture is not checked."""
    from pods.config import ConfigError

    card = cfg["hardware"]["gpu_memory_gb"] if card is None else card
    if cfg["hardware"]["device"] != "cuda" or card is None:
        return
    try:
        est = estimate(cfg, card)
    except ValueError as e:  # a hub model not in pods.architectures nor in the local cache: from_pretrained will fetch it
        log.warning(f"memory not estimated: {e}")
        return
    if not est.fits:
        raise ConfigError(refusal(cfg, est))


if __name__ == "__main__":
    from pods.memory_report import main

    main()
