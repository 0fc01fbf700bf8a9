"""What ``pods-eval`` evaluates: a model directory, a hub id, or a pods run directory, resolved WITHOUT loading
anything (``resolve``: bad input is a ``ConfigError`` before a model loads), then loaded (``load``).

A run directory (its ``config.json`` is a pods config) gives, in this order: ``--checkpoint`` (a file name under
``checkpoints/`` or ``latest``), else ``final/`` (``save_pretrained`` at the end: full weights, or a LoRA adapter,
which is put over the run's base model), else its latest checkpoint. A checkpoint holds the full state dict, or
only the ``lora_`` tensors of a LoRA run (then the run's LoRA settings rebuild the adapter over the base).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pods.errors import ConfigError


@dataclass(frozen=True)
class Target:
    kind: str  # "model" (a directory or hub id) | "final" | "checkpoint"
    base: str  # the model directory or hub id loaded first (the run's base model for a run)
    weights: Path | None = None  # final/ or the checkpoint file
    lora: dict | None = None  # the run's hardware.lora when its weights are a LoRA adapter
    run_dir: Path | None = None
    run_cfg: dict | None = None


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
        check_model_available(Model.of({"name": model, "path": model}))  # a hub id offline and not cached: one line
        return Target("model", model)
    lora = cfg["hardware"].get("lora") if cfg["hardware"].get("finetune") == "lora" else None
    kind, weights = run_weights(path, checkpoint)  # before the base is resolved: a tiny builder would build it
    run_model = Model.of(cfg["model"])  # the run's model section, validated (ConfigError naming the key)
    check_model_available(run_model)
    base = str(resolve_model_dir(run_model))
    if kind == "final" and not (weights / "adapter_config.json").is_file():
        lora = None
    return Target(kind, base, weights, lora, path, cfg)


def run_weights(path: Path, checkpoint: str | None) -> tuple[str, Path]:
    final, ckpts = path / "final", path / "checkpoints"
    if checkpoint:
        name = (ckpts / "latest").read_text().strip() if checkpoint == "latest" and (ckpts / "latest").exists() else checkpoint
        file = ckpts / name
        if not file.is_file():
            found = ", ".join(p.name for p in sorted(ckpts.glob("step_*.pt"))) or "none"
            raise ConfigError(f"--checkpoint: {file} not found; in {ckpts}: {found}")
        return "checkpoint", file
    if (final / "config.json").is_file() or (final / "adapter_config.json").is_file():
        return "final", final
    latest = sorted(ckpts.glob("step_*.pt"))
    if latest:
        return "checkpoint", latest[-1]
    raise ConfigError(
        f"run directory {path} has no weights: no final/ and no checkpoints/step_*.pt (train with train.checkpoint_at_end=weights)"
    )


def load(t: Target, device: str = "cpu", dtype: str = "float32"):
    """(model in eval mode, its directory for the tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pods.models import DTYPES

    if t.kind == "final" and t.lora is None:
        model = AutoModelForCausalLM.from_pretrained(str(t.weights), dtype=DTYPES[dtype])
    else:
        model = AutoModelForCausalLM.from_pretrained(t.base, dtype=DTYPES[dtype])
    if t.kind == "final" and t.lora is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(t.weights))
    elif t.kind == "checkpoint":
        model = _from_checkpoint(model, t)
    return model.to(torch.device(device)).eval(), t.base


def _from_checkpoint(model, t: Target):
    from pods.checkpoint import read

    blob = read(t.weights)
    state = blob["backend"]
    if "shards" in state:
        raise ConfigError(f"{t.weights} is a sharded (DeepSpeed) checkpoint: evaluate the run's final/ weights instead")
    if t.lora is not None:
        from peft import LoraConfig, get_peft_model

        lc = t.lora
        model = get_peft_model(
            model,
            LoraConfig(
                r=lc["r"], lora_alpha=lc["alpha"], lora_dropout=0.0, target_modules=list(lc["target_modules"]), task_type="CAUSAL_LM"
            ),
        )
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    if unexpected:
        raise ConfigError(f"{t.weights}: weights that do not fit the model: {unexpected[:3]}")
    return model
