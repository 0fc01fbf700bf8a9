"""The architectures of the paper's models, as their config.json files give them (numbers only, no weights).

Used where a model's shape is needed without its files: the memory estimate (``pods.memory``) of a run whose model
is a hub id not on this machine, and the GPU check (``benchmarks/bench_gpu.py``), which builds random-initialised
models of the exact architectures. ``model_config(model)`` reads a local directory's config.json when the
model section points at one, else the table below by hub id, else the tiny model's spec.
"""

from __future__ import annotations

import json
from pathlib import Path

# The fields of each model's config.json that fix its shape (Qwen2.5: tied embeddings on 3B only).
ARCHITECTURES: dict[str, dict] = {
    "Qwen/Qwen2.5-3B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen2.5-7B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    },
    "meta-llama/Llama-3.2-3B-Instruct": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    },
}
# The other experiments' models (Sparse-RL: the Qwen2.5-3B base, whose shape is the Instruct model's; D3S).
ARCHITECTURES["Qwen/Qwen2.5-3B"] = dict(ARCHITECTURES["Qwen/Qwen2.5-3B-Instruct"])
ARCHITECTURES["Qwen/Qwen2.5-Math-7B"] = {
    **ARCHITECTURES["Qwen/Qwen2.5-7B-Instruct"],
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
}
ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"] = {  # D3S's speed table (Table 3)
    **ARCHITECTURES["Qwen/Qwen2.5-3B-Instruct"],
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
}
ARCHITECTURES["Qwen/Qwen2.5-0.5B-Instruct"] = {  # the one-GPU quickstart's model (conf/experiment/gsm8k_qwen0_5b_*_1gpu.yaml)
    **ARCHITECTURES["Qwen/Qwen2.5-3B-Instruct"],
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
}
ARCHITECTURES["meta-llama/Llama-3.1-8B-Instruct"] = {
    **ARCHITECTURES["meta-llama/Llama-3.2-3B-Instruct"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
}

# Qwen3 (dense): per-head RMSNorms on q and k (``q_norm``/``k_norm``, head_dim weights each), no q/k/v biases, an
# explicit head_dim of 128; tied embeddings up to 4B. Published sizes (model cards): 0.6B (0.44B non-embedding), 1.7B
# (1.4B), 4B (3.6B), 8.2B (6.95B), checked against ``parameter_count`` in tests/unit/test_qwen3.py.
QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "head_dim": 128,
    "num_key_value_heads": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, tied: bool) -> dict:
    shape = {"hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads}
    return {**QWEN3, **shape, "tie_word_embeddings": tied}


ARCHITECTURES["Qwen/Qwen3-0.6B"] = _qwen3(1024, 3072, 28, 16, tied=True)
ARCHITECTURES["Qwen/Qwen3-1.7B"] = _qwen3(2048, 6144, 28, 16, tied=True)
ARCHITECTURES["Qwen/Qwen3-4B"] = _qwen3(2560, 9728, 36, 32, tied=True)
ARCHITECTURES["Qwen/Qwen3-8B"] = _qwen3(4096, 12288, 36, 32, tied=False)
QK_NORM_TYPES = ("qwen3",)  # model types with per-head RMSNorms on q and k (weights of head_dim each)


def tiny_config(spec: dict | None = None) -> dict:
    """The tiny model's config.json fields, from ``pods.tiny.DEFAULT_SPEC`` updated by ``spec`` (a Qwen2, or a Qwen3
    with ``spec["architecture"]``, whose head_dim is hidden / heads)."""
    from pods.tiny import DEFAULT_SPEC, architecture

    full = {**DEFAULT_SPEC, **(spec or {})}
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    out = {k: full[k] for k in keys}
    prefix, _, _, named = architecture(full)
    out.update({"head_dim": full["hidden_size"] // full["num_attention_heads"]} if "head_dim" in named else {})
    out.update(
        architectures=[f"{prefix}ForCausalLM"],
        model_type=prefix.lower(),
        max_position_embeddings=full["max_position_embeddings"],
        tie_word_embeddings=True,
        hidden_act="silu",
        torch_dtype="float32",
    )
    return out


def model_config(model) -> dict:
    """config.json of the model a ``model`` config section (``pods.schema.Model``) names: a local directory's file, the
    table, or the tiny spec."""
    path = model.path
    if model.builder == "tiny":
        return tiny_config(model.spec)
    if path and (Path(path) / "config.json").is_file():
        return json.loads((Path(path) / "config.json").read_text())
    if path in ARCHITECTURES:
        return dict(ARCHITECTURES[path])
    known = ", ".join(ARCHITECTURES)
    raise ValueError(
        f"model.path={path!r}: no config.json there and not a known architecture ({known}); point model.path at a local model directory"
    )


def head_dim(arch: dict) -> int:
    return int(arch.get("head_dim") or arch["hidden_size"] // arch["num_attention_heads"])


def parameter_count(arch: dict) -> int:
    """Parameters of a Qwen2/Qwen3/Llama decoder (Qwen2: q/k/v biases; Qwen3: q/k RMSNorms of head_dim each),
    embeddings counted once when tied."""
    h, i, layers, v = arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"], arch["vocab_size"]
    hd, nq, nkv = head_dim(arch), arch["num_attention_heads"], arch["num_key_value_heads"]
    attn = h * nq * hd + 2 * h * nkv * hd + nq * hd * h
    if arch.get("model_type") == "qwen2":
        attn += nq * hd + 2 * nkv * hd
    if arch.get("model_type") in QK_NORM_TYPES:
        attn += 2 * hd
    per_layer = attn + 3 * h * i + 2 * h
    emb = v * h * (1 if arch.get("tie_word_embeddings") else 2)
    return layers * per_layer + emb + h
