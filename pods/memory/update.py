"""The policy update's memory per GPU, component by component (``pods.memory`` adds the rollout engine).

Counted from the code path that runs (``pods.backends``: transformers' Qwen2/Qwen3/Llama layers with SDPA attention,
peft's LoRA layers, ``pods.losses.chunked_token_stats``, DeepSpeed ZeRO): what stays between updates (weights,
optimizer state, ZeRO buffers), then one micro-batch's gradients, saved activations and the largest transient
of its backward pass, or the optimizer step's temporaries, whichever peak is higher. Bytes, not GB, inside.
"""

from __future__ import annotations

from pods.architectures import QK_NORM_TYPES, head_dim, parameter_count
from pods.engines.memory import DTYPE_BYTES, seq_tokens
from pods.plan import largest_micro_batch, token_budget_rows

NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # bitsandbytes NF4, double quantisation: codes + an 8-bit scale per 64 + fp32 per 256 blocks
ADAM8_BYTES = 2 + 2 * 4 / 256  # bitsandbytes 8-bit AdamW: two uint8 states + fp32 scales per block of 256
LOSS_FP32_COPIES = 5  # [rows, V] fp32 tensors at the chunked loss's backward peak (measured on CPU: 5.0 in fp32 and bf16)
ZERO_DEFAULTS = {"reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5}


def linear_shapes(arch: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer of one decoder layer (Qwen2/Qwen3/Llama: attention widths heads x head_dim)."""
    h, i, hd = arch["hidden_size"], arch["intermediate_size"], head_dim(arch)
    q, kv = arch["num_attention_heads"] * hd, arch["num_key_value_heads"] * hd
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return dict(zip(names, [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]))


def lora_targets(hw) -> set[str]:
    """The decoder linears ``hw.lora.target_modules`` adapts (``hw``: the hardware section)."""
    t, names = (
        hw.lora.target_modules,
        set(linear_shapes({"hidden_size": 1, "intermediate_size": 1, "num_attention_heads": 1, "num_key_value_heads": 1})),
    )
    return names if t == "all-linear" else {t} & names if isinstance(t, str) else set(t) & names


def lora_params(arch: dict, hw) -> int:
    r, targets = hw.lora.r, lora_targets(hw)
    return arch["num_hidden_layers"] * sum(r * (a + b) for name, (a, b) in linear_shapes(arch).items() if name in targets)


def layer_saved_bytes(arch: dict, a: int, full: bool, lora: tuple[set, int] | None) -> float:
    """Bytes per token that autograd keeps for one decoder layer without checkpointing (the padding mask apart);
    ``a`` = activation bytes, ``full`` = the base weights train, ``lora`` = (targets, r).

    Both RMSNorms keep their fp32 input and 1/rms; attention keeps q, k and v (k and v expanded to every head by
    ``repeat_kv``: a padding mask rules out SDPA's own GQA), the output and the fp32 log-sum-exp per head; the MLP
    keeps gate, up and act(gate). Trainable base weights add the normalised norm inputs and the inputs of q/k/v,
    gate/up and down. A LoRA adapter (fp32 weights) keeps its input: an fp32 copy
    per adapter when activations are bf16 (peft casts x to the adapter's dtype), shared ones when fp32; plus its
    r-wide output. Qwen3's per-head q/k RMSNorms keep their fp32 inputs and 1/rms per head, and, when their weights
    train, their normalised outputs. Attention's widths are heads x head_dim (Qwen3-4B: 4,096 on a hidden size of
    2,560). Equal to autograd's saved tensors on CPU, fp32 and bf16, Qwen2 and Qwen3 (tests/unit/test_memory.py).
    """
    h, i, hd = arch["hidden_size"], arch["intermediate_size"], head_dim(arch)
    heads, kv_heads = arch["num_attention_heads"], arch["num_key_value_heads"]
    q, kv = heads * hd, kv_heads * hd
    b = 2 * 4 * h + 8 + 4 * a * q + 4 * heads + 3 * a * i
    if full:
        b += 2 * a * h + 2 * a * h + a * i
    if arch.get("model_type") in QK_NORM_TYPES:
        b += 4 * (q + kv) + 4 * (heads + kv_heads) + full * a * (q + kv)
    if lora:
        targets, r = lora
        shapes = linear_shapes(arch)
        if a != 4:
            b += sum(4 * shapes[t][0] for t in targets)
        else:
            b += 4 * h * bool(targets & {"q_proj", "k_proj", "v_proj"}) + 4 * h * bool(targets & {"gate_proj", "up_proj"})
            b += 4 * i * ("down_proj" in targets)
        b += 4 * r * len(targets)
    return b


def _syncs(cfg) -> bool:
    """Whether the rollout engine holds weights of its own (vLLM); a policy engine samples with the trainer's module."""
    from pods.engines import ENGINES

    return ENGINES.get(cfg.rollout.name).needs_sync


def partition(hw) -> tuple[int, int]:
    """(ranks the training state is partitioned over, ZeRO stage; 0: not partitioned): the backend's answer
    (``Backend.partition``; the backend's module is imported here, at the call, as the engines' are)."""
    from pods.backends import BACKENDS

    return BACKENDS.get(hw.backend).partition(hw)


def state_lines(cfg, arch: dict) -> list[tuple[str, float, str]]:
    """(name, bytes per GPU, how) of what the trainer holds across micro-batches (``cfg``: the typed root): weights,
    the KL reference, gradients, optimizer state and ZeRO's buffers."""
    hw, opt = cfg.hardware, cfg.optim.name
    w, P, L, H = DTYPE_BYTES[hw.dtype], parameter_count(arch), arch["num_hidden_layers"], arch["hidden_size"]
    lora, quant = hw.finetune == "lora", cfg.model.quantization == "4bit"
    n, stage = partition(hw)
    ds = stage > 0  # ZeRO: gradients and optimizer state partitioned
    zc = {**ZERO_DEFAULTS, **hw.deepspeed.config.get("zero_optimization", {})}
    out = []
    if quant:  # peft's prepare_model_for_kbit_training casts every non-quantised parameter to fp32
        linear = L * sum(x * y for x, y in linear_shapes(arch).values())
        weights, how = linear * NF4_BYTES + (P - linear) * 4, f"NF4 base {linear / 1e9:.2f}B x {NF4_BYTES:.3f} B + the rest in fp32"
    elif stage == 3:
        whole = (2 * L + 1) * H if zc["stage3_param_persistence_threshold"] > H else 0  # norms under the threshold stay whole
        weights, how = (P - whole) * w / n + whole * w, f"{P / 1e9:.2f}B params x {w} B / {n} ranks (ZeRO-3)"
    else:
        weights, how = P * w, f"{P / 1e9:.2f}B params x {w} B"
    if stage == 3 and hw.deepspeed.offload_param:
        weights, how = 0.0, "offloaded (offload_param)"
    trainable, tbytes = (lora_params(arch, hw), 4) if lora else (P, w)
    if lora:
        weights += trainable * 4
        how += f" + LoRA {trainable / 1e6:.0f}M x 4 B"
    out.append(("weights", weights, how))
    if cfg.train.max_staleness and not _syncs(cfg):  # pods.engines.frozen: the producer samples from a deep copy
        out.append(("frozen policy copy (producer)", weights, "train.max_staleness >= 1: the producer's copy of the policy"))
    if cfg.algorithm.beta > 0 and not lora:  # LoRA's reference is the base with the adapter off
        out.append(
            ("reference model (KL)", P * w / (n if stage == 3 else 1), "frozen copy" + (" (ZeRO-3 partition)" if stage == 3 else ""))
        )
    if ds:  # ZeRO's gradient partitions accumulate in float32 (pods.backends.deepspeed: data_types.grad_accum_dtype)
        out.append(("gradients", trainable * 4 / n, f"{trainable / 1e6:.0f}M x 4 B (fp32 accumulation) / {n} ranks"))
    else:
        out.append(("gradients", trainable * tbytes, f"{trainable / 1e6:.0f}M x {tbytes} B"))
    if ds:
        optim, how = (0.0, "offloaded") if hw.deepspeed.offload_optimizer else (12 * P / n, f"fp32 master + m + v: 12 B/param / {n} ranks")
    elif opt == "adamw_8bit":
        optim, how = trainable * ADAM8_BYTES, f"bitsandbytes 8-bit m, v: {ADAM8_BYTES:.2f} B/param"
    else:
        optim, how = 2 * trainable * tbytes, f"torch AdamW m, v: {2 * tbytes} B/param"
    out.append(("optimizer state", optim, how))
    if stage == 2:
        out.append(("ZeRO buffers", (2 if hw.deepspeed.overlap_comm else 1) * zc["reduce_bucket_size"] * w, "reduce buckets"))
    elif stage == 3:
        layer = sum(x * y for x, y in linear_shapes(arch).values())
        block = max(arch["vocab_size"] * H, layer)  # the largest module gathered at once: embedding/head or one layer
        gathered = (2 * block + min(zc["stage3_prefetch_bucket_size"], block) + zc["reduce_bucket_size"]) * w
        out.append(("ZeRO buffers", gathered, f"largest block {block / 1e6:.0f}M gathered + its grad + prefetch + reduce bucket"))
    return out


def activation_lines(cfg, arch: dict) -> list[tuple[str, float, str, str]]:
    """(name, bytes, how, kind) of the run's largest micro-batch (``pods.plan``'s plan): the activations autograd keeps
    ("sum") and the transients of the backward pass, of which only the largest is alive at once ("max")."""
    hw = cfg.hardware
    L, H, F, V = arch["num_hidden_layers"], arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    quant, lora = cfg.model.quantization == "4bit", hw.finetune == "lora"
    a = 4 if quant else DTYPE_BYTES[hw.dtype]  # the k-bit prep's fp32 embeddings and norms make the residual stream fp32
    mb = largest_micro_batch(cfg.algorithm, cfg.train.prompts_per_step, hw.micro_batch_size)
    p_len, c_len = seq_tokens(cfg)
    T = p_len + c_len
    mb = token_budget_rows(mb, T, hw.micro_batch_tokens)  # hardware.micro_batch_tokens: fewer full-length rows at once
    tok = mb * T
    per_layer = layer_saved_bytes(arch, a, full=not lora, lora=(lora_targets(hw), hw.lora.r) if lora else None)
    mask = mb * T * T * a  # SDPA's float copy of the boolean padding mask, made (and kept for backward) per layer
    outside = tok * (4 * H + 2 * a * H * (not lora)) + mb * c_len * a * H  # final norm; the loss rows' hidden states, copied
    grads = tok * a * (2 * F + 2 * H)  # a layer's backward: gradients of its MLP and residual stream
    if hw.gradient_checkpointing:
        saved, how = L * tok * a * H, f"checkpointed: {L} layer inputs x {tok:.0f} tokens x {a} B x {H}"
        work, whow = tok * per_layer + mask + grads, "one layer recomputed, its mask and gradients"
    else:
        saved, how = L * (tok * per_layer + mask), f"{L} layers x {tok:.0f} tokens x {per_layer / 1e3:.1f} kB + a {T}x{T} mask each"
        work, whow = grads, "a layer's gradients"
    chunk = hw.logprob_chunk_tokens
    rows = min(int(chunk), mb * c_len) if chunk else mb * c_len
    out = [
        ("activations (saved)", saved + outside, how + "; final norm, loss rows", "sum"),
        ("layer backward", work, whow, "max"),
        (
            "loss logits",
            rows * V * 4 * LOSS_FP32_COPIES,
            f"{rows:.0f} rows x {V} x 4 B x {LOSS_FP32_COPIES}" + ("" if chunk else " (one chunk)"),
            "max",
        ),
    ]
    if cfg.algorithm.beta > 0:  # the reference's no-grad forward runs while the policy's activations are kept
        out.append(("reference forward (KL)", tok * a * (3 * F + 4 * H), "no grad: one layer's intermediates", "max"))
    return out


def step_temporaries(cfg, arch: dict) -> float:
    """Bytes the optimizer step adds on top of weights, gradients and state (activations are freed by then):
    DeepSpeed's fp32 gradient partition and AdamW's update temporaries; torch AdamW's foreach copies."""
    hw, P = cfg.hardware, parameter_count(arch)
    n, stage = partition(hw)
    if stage:
        return 0.0 if hw.deepspeed.offload_optimizer else 8 * P / n
    if cfg.optim.name != "adamw":
        return 0.0
    return lora_params(arch, hw) * 4 if hw.finetune == "lora" else P * DTYPE_BYTES[hw.dtype]
