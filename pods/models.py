"""Resolve and load the policy model and tokenizer, with fast, clear errors before anything heavy.

``model.builder`` names a function that builds a model directory in code (the tiny CPU model);
otherwise ``model.path`` is a local directory or a hub id loaded with ``from_pretrained``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from pods.registry import Registry

BUILDERS = Registry("model builder")


@BUILDERS.register("tiny")
def _build_tiny(model_cfg: dict) -> Path:
    from pods.tiny import ensure_tiny

    return ensure_tiny(model_cfg.get("spec") or {}, model_cfg.get("cache_dir"))


def check_model_available(model_cfg: dict) -> None:
    """Fail in well under a second when a hub id cannot be loaded (offline, not cached)."""
    if model_cfg.get("builder"):
        BUILDERS.get(model_cfg["builder"])  # unknown builder -> ValueError naming the valid ones
        return
    path = model_cfg.get("path")
    if not path:
        raise ValueError("model.path is required (a local directory or a hub id) unless model.builder is set")
    if Path(path).is_dir():
        return
    if Path(path).is_absolute() or path.startswith("."):
        raise ValueError(f"model.path '{path}' is not a directory")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(path, "config.json")
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if offline and not isinstance(cached, str):
        raise ValueError(
            f"model.path '{path}' is a hub id, HF_HUB_OFFLINE is set and the model is not in the local HF cache: "
            "download it on a machine with network (huggingface-cli download) and set model.path=/local/dir"
        )


def resolve_model_dir(model_cfg: dict) -> str:
    if model_cfg.get("builder"):
        return str(BUILDERS.get(model_cfg["builder"])(model_cfg))
    return model_cfg["path"]


def load_tokenizer(model_dir: str):
    from pods.tiny import load_tokenizer as load

    tok = load(model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(model_dir: str, hw: dict, **kwargs):
    """from_pretrained with the hardware profile's dtype; a clear message when the hub is unreachable."""
    from transformers import AutoModelForCausalLM

    if hw["dtype"] not in DTYPES:
        raise ValueError(f"hardware.dtype '{hw['dtype']}' unknown; valid: {', '.join(DTYPES)}")
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[hw["dtype"]], **kwargs)
    except OSError as e:
        raise RuntimeError(f"could not load model '{model_dir}': {e}. Offline? Point model.path at a local directory.") from e
    if hw.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model
