"""What ``pods-eval`` evaluates: a model directory, a hub id, or a pods run directory, resolved WITHOUT loading a
model (``resolve``: bad input is a ``ConfigError`` before a model loads), then loaded (``load``).

A run directory (its ``config.json`` is a pods config) gives, in this order: ``--checkpoint`` (a file name under
``checkpoints/`` or ``latest``), else ``final/`` (``save_pretrained`` at the end: full weights, or a LoRA adapter,
which is put over the run's base model), else its latest checkpoint. A checkpoint holds the full state dict, or
only the ``lora_`` tensors of a LoRA run (then the run's LoRA settings rebuild the adapter over the base); it is read
here, once, so that a truncated or foreign file is one line before the model loads.

A model directory holds a model and its tokenizer (``config.json`` and ``tokenizer_config.json``), or a LoRA adapter
(``adapter_config.json``, whose ``base_model_name_or_path`` is the base it goes over). A run's ``final/`` is such a
directory (its tokenizer saved beside the weights); given as ``RUN/final`` it keeps the run's prompt and writes
under the run directory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pods.errors import ConfigError

TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer.tiktoken")


@dataclass(frozen=True)
class Target:
    kind: str  # "model" (a directory or hub id) | "final" (final/ or an adapter directory) | "checkpoint"
    base: str  # the model directory or hub id loaded first (the run's base model for a run, an adapter's base)
    weights: Path | None = None  # final/ (an adapter directory) or the checkpoint file
    lora: dict | None = None  # the LoRA settings when the weights are an adapter (a run's hardware.lora, or adapter_config.json)
    run_dir: Path | None = None
    run_cfg: dict | None = None
    tokenizer: str | None = None  # the directory the tokenizer loads from; None = base
    state: dict | None = field(default=None, repr=False, compare=False)  # a checkpoint's model tensors, read by resolve


def run_config(path: Path) -> dict | None:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        return None
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError:
        return None
    return cfg if isinstance(cfg, dict) and "algorithm" in cfg and "model" in cfg else None


def resolve(model: str, checkpoint: str | None = None) -> Target:
    from pods.models import check_model_available, resolve_model_dir
    from pods.schema import Model

    path = Path(model)
    cfg = run_config(path) if path.is_dir() else None
    if cfg is None:
        if checkpoint:
            raise ConfigError(f"--checkpoint needs a pods run directory; '{model}' is not one (no pods config.json)")
        if path.is_dir():
            return model_directory(path)
        if path.exists() or path.is_absolute() or model.startswith("."):
            raise ConfigError(f"'{model}' is not a model directory, a hub id or a pods run directory")
        check_model_available(Model.of({"name": model, "path": model}))  # a hub id offline and not cached: one line
        return Target("model", model)
    lora = cfg["hardware"].get("lora") if cfg["hardware"].get("finetune") == "lora" else None
    kind, weights = ("model", None) if checkpoint == "base" else run_weights(path, checkpoint)  # before a tiny builder builds the base
    run_model = Model.of(cfg["model"])  # the run's model section, validated (ConfigError naming the key)
    check_model_available(run_model)
    base = str(resolve_model_dir(run_model))
    if kind == "model":  # --checkpoint base: the model the run started from (step 0)
        return Target(kind, base, run_dir=path, run_cfg=cfg)
    if kind == "final" and not (weights / "adapter_config.json").is_file():
        lora = None
    state = checkpoint_model_state(weights) if kind == "checkpoint" else None
    return Target(kind, base, weights, lora, path, cfg, state=state)


def model_directory(path: Path) -> Target:
    """A directory that is not a run: a model with its tokenizer, or a LoRA adapter over the base it names. A run's
    ``final/`` keeps its run (``run_dir``, ``run_cfg``: the run's prompt, output under the run)."""
    run_dir = path.resolve().parent if path.resolve().name == "final" else None
    run_cfg = run_config(run_dir) if run_dir else None
    run_dir = run_dir if run_cfg else None
    has_tokenizer = any((path / f).is_file() for f in TOKENIZER_FILES)
    if (path / "adapter_config.json").is_file():
        adapter = _read_json(path / "adapter_config.json")
        base = adapter.get("base_model_name_or_path")
        if not base:
            raise ConfigError(f"{path}/adapter_config.json names no base model (base_model_name_or_path)")
        if not Path(base).is_dir() and (Path(base).is_absolute() or base.startswith(".")):
            raise ConfigError(f"{path} is a LoRA adapter over {base}, which is not here (copy the base there, or edit adapter_config.json)")
        if not Path(base).is_dir():
            from pods.models import check_model_available
            from pods.schema import Model

            check_model_available(Model.of({"name": base, "path": base}))
        lora = {k: adapter.get(k) for k in ("r", "lora_alpha", "target_modules")}
        return Target("final", base, path, lora, run_dir, run_cfg, tokenizer=str(path) if has_tokenizer else None)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} holds no model: no config.json or adapter_config.json, and it is not a pods run directory")
    if not has_tokenizer:
        hint = f"evaluate the run instead: pods-eval {run_dir}" if run_dir else "save the tokenizer beside the weights"
        raise ConfigError(f"{path} has model weights but no tokenizer ({', '.join(TOKENIZER_FILES[:2])}): {hint}")
    return Target("final" if run_dir else "model", str(path), path if run_dir else None, None, run_dir, run_cfg)


def _read_json(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file} is not a JSON object")
    return data


def run_weights(path: Path, checkpoint: str | None) -> tuple[str, Path]:
    final, ckpts = path / "final", path / "checkpoints"
    steps = sorted(ckpts.glob("step_*.pt"))
    if checkpoint:
        name = (ckpts / "latest").read_text().strip() if checkpoint == "latest" and (ckpts / "latest").is_file() else checkpoint
        file = ckpts / name
        if not file.is_file() and checkpoint == "latest" and steps:  # a marker naming a file that is gone (or no marker)
            print(
                f"pods-eval: {ckpts / 'latest'} names {name}, which does not exist; using the newest checkpoint, {steps[-1].name}",
                file=sys.stderr,
            )
            file = steps[-1]
        if not file.is_file():
            found = ", ".join(p.name for p in steps) or "none"
            raise ConfigError(f"--checkpoint: {file} not found; in {ckpts}: {found}")
        return "checkpoint", file
    if (final / "config.json").is_file() or (final / "adapter_config.json").is_file():
        return "final", final
    if steps:
        return "checkpoint", steps[-1]
    raise ConfigError(
        f"run directory {path} has no weights: no final/ and no checkpoints/step_*.pt (train with train.checkpoint_at_end=weights)"
    )


def checkpoint_model_state(file: Path) -> dict:
    """The model tensors of a pods checkpoint, read without running code from it; one line naming ``--checkpoint``
    when it is truncated, corrupt, not a pods checkpoint, or sharded (DeepSpeed)."""
    import pickle

    import torch

    from pods.checkpoint import FORMAT

    others = ", ".join(p.name for p in sorted(file.parent.glob("step_*.pt")) if p != file)
    hint = f"choose another with --checkpoint FILE ({file.parent} holds {others})" if others else f"{file.parent} holds no other checkpoint"
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(f"--checkpoint: {file} is not a pods checkpoint (not tensors and plain types torch can read); {hint}") from None
    except Exception as e:  # noqa: BLE001 - a truncated zip, a file of something else: torch's reasons are long
        reason = str(e).split(". ")[0].strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--checkpoint: {file} cannot be read, truncated or corrupt ({reason}); {hint}") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise ConfigError(f"--checkpoint: {file} is not a pods checkpoint of format {FORMAT} (found {found!r}); {hint}")
    backend = blob.get("backend") or {}
    if "shards" in backend:
        raise ConfigError(f"--checkpoint: {file} is a sharded (DeepSpeed) checkpoint: evaluate the run's final/ weights instead")
    return backend["model"]


def load(t: Target, device: str = "cpu", dtype: str = "float32", quantized: bool = False):
    """(model in eval mode, its directory for the tokenizer). ``quantized``: a run trained on a 4-bit base
    (``model.quantization``) gets that base as it trained, NF4 through bitsandbytes on ``device`` (CUDA), under its
    adapter (``pods-export`` dequantises it); else the base loads in ``dtype``, as ``pods-eval`` evaluates it."""
    import torch
    from transformers import AutoModelForCausalLM

    from pods.models import DTYPES

    if t.kind == "final" and t.lora is None:
        model = AutoModelForCausalLM.from_pretrained(str(t.weights), dtype=DTYPES[dtype])
    elif quantized:
        model = quantized_base(t, device, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(t.base, dtype=DTYPES[dtype])
    if t.kind == "final" and t.lora is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(t.weights))
    elif t.kind == "checkpoint":
        model = _from_checkpoint(model, t)
    return (model if quantized else model.to(torch.device(device))).eval(), t.base


def last_step(run_dir: Path) -> int | None:
    """The run's last training step (its metrics.jsonl's newest ``train`` row): the step of its ``final/``."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        return None
    from pods.metrics import read_metrics

    steps = [r["step"] for r in read_metrics(metrics, "train") if isinstance(r.get("step"), int)]
    return max(steps) if steps else None


def quantization(t: Target) -> str | None:
    """The run's ``model.quantization`` (``4bit``: its LoRA adapter trained over an NF4 base); None elsewhere."""
    return ((t.run_cfg or {}).get("model") or {}).get("quantization")


def quantized_base(t: Target, device: str, dtype: str):
    """The run's base as its training loaded it (``pods.models.load_policy``, the run's 4-bit settings), on ``device``."""
    from pods.models import load_policy
    from pods.schema import Hardware

    hw = Hardware.of({**t.run_cfg["hardware"], "device": device, "dtype": dtype, "gradient_checkpointing": False})
    return load_policy(t.base, hw, quantization=quantization(t))


def _from_checkpoint(model, t: Target):
    if t.lora is not None:
        from peft import LoraConfig, get_peft_model

        lc = t.lora
        model = get_peft_model(
            model,
            LoraConfig(
                r=lc["r"], lora_alpha=lc["alpha"], lora_dropout=0.0, target_modules=list(lc["target_modules"]), task_type="CAUSAL_LM"
            ),
        )
    state = t.state if t.state is not None else checkpoint_model_state(t.weights)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ConfigError(f"{t.weights}: weights that do not fit the model: {unexpected[:3]}")
    return model
