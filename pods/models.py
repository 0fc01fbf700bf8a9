"""Resolve and load the policy model and tokenizer, with fast, clear errors before anything heavy.

``model.builder`` names a function that builds a model directory in code (the tiny CPU model);
otherwise ``model.path`` is a local directory or a hub id loaded with ``from_pretrained``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from pods.registry import Registry
from pods.schema import Hardware, Model

BUILDERS = Registry("model builder")


@BUILDERS.register("tiny")
def _build_tiny(model: Model) -> Path:
    from pods.tiny import ensure_tiny, with_template_kwargs

    return ensure_tiny(with_template_kwargs(model.spec, model.chat_template_kwargs), model.cache_dir)


ASSET_KEYS = Registry("model asset key")  # builder -> what names the exact model it gives (config.json's provenance)


@ASSET_KEYS.register("tiny")
def _tiny_asset(model: Model) -> dict:
    from pods.tiny import asset_name, shipped, with_template_kwargs

    spec = with_template_kwargs(model.spec, model.chat_template_kwargs)
    return {"asset": asset_name(spec), "shipped": shipped(spec) is not None}


def provenance(model: Model) -> dict:
    """What a run ran on, for its config.json: the model (a builder's asset key, else ``model.path``) and the CPU
    numerics (``pods.numerics.record``)."""
    from pods.numerics import record

    asset = ASSET_KEYS.get(model.builder)(model) if model.builder else {"asset": model.path}
    return {"model": asset, "numerics": record()}


def unwrap(model):
    """The transformers model inside a DeepSpeed engine (``.module``) and/or a peft wrapper (``get_base_model()``):
    the one way every layer reaches the plain model (its config, decoder, head and generation_config)."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def check_model_available(model: Model) -> None:
    """Fail within seconds, naming model.path, when a hub id cannot be loaded (offline, not cached). ``model``: the
    model section."""
    from pods.errors import ConfigError

    if model.builder:
        BUILDERS.get(model.builder)  # unknown builder -> ValueError naming the valid ones
        return
    path = model.path
    if not path:
        raise ConfigError("model.path is required (a local directory or a hub id) unless model.builder is set")
    if Path(path).is_dir():
        return
    if Path(path).is_absolute() or path.startswith("."):
        raise ConfigError(f"model.path '{path}' is not a directory")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(path, "config.json")
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if isinstance(cached, str):
        return
    hint = "download it where there is network (huggingface-cli download ID --local-dir DIR) and set model.path=DIR"
    if offline:
        raise ConfigError(f"model.path '{path}' is a hub id, HF_HUB_OFFLINE is set and it is not in the local HF cache: {hint}")
    if not _hub_reachable():
        raise ConfigError(f"model.path '{path}' is a hub id but the hub is unreachable (no network?): {hint}")


def _hub_reachable(timeout: float = 3.0) -> bool:
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve_model_dir(model: Model) -> str:
    """The model's directory: built by ``model.builder`` (first use), else ``model.path`` (a directory or a hub id)."""
    if model.builder:
        return str(BUILDERS.get(model.builder)(model))
    return model.path


def load_tokenizer(model_dir: str):
    from pods.tiny import load_tokenizer as load

    tok = load(model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(model_dir: str, hw: Hardware, quantization: str | None = None, **kwargs):
    """from_pretrained with the hardware profile's dtype (and an optional 4-bit NF4 base for LoRA, as the
    authors' single-GPU runs); a clear message when the hub is unreachable."""
    from transformers import AutoModelForCausalLM

    if quantization == "4bit":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=DTYPES[hw.dtype]
        )
        kwargs["device_map"] = {"": hw.device}
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[hw.dtype], **kwargs)
    except OSError as e:
        raise RuntimeError(f"could not load model '{model_dir}': {e}. Offline? Point model.path at a local directory.") from e
    if hw.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model
