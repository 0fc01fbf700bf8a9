"""A model's weights as one plain Hugging Face model directory (``write_plain``): what ``pods-export`` writes and what
``pods-eval --engine vllm`` hands an engine that loads its own copy.

A LoRA model is merged out of place, in float32: every target layer's weight becomes ``W + scale * B @ A`` summed
over its active adapters (``pods.backends.local.exported_weight``, the same value the training run synced into vLLM),
then rounded once to the output dtype. A 4-bit NF4 base (``model.quantization=4bit``, bitsandbytes, GPU only) is
dequantised layer by layer first, so the directory holds the function the run trained: dequant(NF4(W)) + delta, not
the full-precision W + delta. The config loses its ``quantization_config``; tied embeddings are saved once.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def plain_state(model, dtype=None) -> dict:
    """HF name -> tensor of ``model`` (a transformers model, a peft model, or one on a 4-bit base) with every LoRA
    adapter merged and every packed weight dequantised, on the CPU; merged tensors summed in float32, then each rounded
    to ``dtype`` (a torch dtype; None: float32 for merged tensors) as soon as it is made (one model's worth at a time)."""
    from pods.backends.local import exported_weight
    from pods.models import unwrap

    base = unwrap(model)
    modules = dict(base.named_modules())
    out = {}
    for name, p in base.named_parameters(remove_duplicate=False):
        if "lora_" not in name:
            w = exported_weight(modules, name, p).detach()
            out[name.replace(".base_layer", "")] = (w if dtype is None else w.to(dtype)).cpu().contiguous()
    return out


def plain_config(model, dtype: str):
    """The model's config as a plain model's: no ``quantization_config``, ``dtype`` named."""
    from pods.models import unwrap

    config = copy.deepcopy(unwrap(model).config)
    for key in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = dtype
    return config


def write_plain(model, out: Path, dtype: str, tokenizer=None) -> list[str]:
    """Write ``model`` (see ``plain_state``) into ``out`` as safetensors in ``dtype`` (shards of at most 5 GB), with its
    config, generation config and ``tokenizer`` (with its chat template); the tensor names written."""
    from huggingface_hub import save_torch_state_dict

    from pods.models import DTYPES, unwrap

    config = plain_config(model, dtype)
    state = plain_state(model, DTYPES[dtype])
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the input embedding is the head: saved once, tied again on load
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    generation = getattr(unwrap(model), "generation_config", None)
    if generation is not None:
        generation.save_pretrained(out)
    save_torch_state_dict(state, out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return sorted(state)


@contextmanager
def engine_dir(target, dtype: str, tokenizer, near: Path) -> Iterator[str]:
    """A directory an engine that loads its own weights (vLLM) can load ``target`` from: a plain model directory as it
    is (a hub id, a model directory, a run's full ``final/``), else the weights written plain (``write_plain``) into a
    temporary directory beside ``near`` (the evaluation's output: on the run's disk, not a RAM-backed /tmp), deleted
    when the ``with`` ends, an error included."""
    from pods.eval.weights import load, quantization

    if target.kind == "model" or (target.kind == "final" and target.lora is None and has_tokenizer(target.weights)):
        yield str(target.weights or target.base)
        return
    base = Path(near)
    while not base.exists():
        base = base.parent
    tmp = Path(tempfile.mkdtemp(prefix=".pods-eval-weights-", dir=base))
    try:
        quantized = quantization(target) == "4bit"  # merged over the NF4 base it trained on (GPU), as pods-export does
        model, _ = load(target, "cuda" if quantized else "cpu", dtype, quantized=quantized)
        write_plain(model, tmp, dtype, tokenizer)
        del model
        yield str(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def has_tokenizer(path: Path | None) -> bool:
    from pods.eval.weights import TOKENIZER_FILES

    return path is not None and any((Path(path) / f).is_file() for f in TOKENIZER_FILES)
