"""``pods-export RUN [--checkpoint step_N.pt|latest] OUT`` / ``python -m pods.export``: a pods run's weights as a plain
Hugging Face model directory, which ``AutoModelForCausalLM.from_pretrained(OUT)``, ``AutoTokenizer`` and
``vllm.LLM(model=OUT)`` load as they would any model.

The weights: ``--checkpoint`` (a file under ``RUN/checkpoints/`` or ``latest``), else ``final/``, else the newest
checkpoint (as ``pods-eval`` picks them, ``pods.eval.weights``). The weights load in the run's own dtype (its stored values,
exactly); a LoRA run's adapter is merged into its base in float32 and rounded once to ``--dtype`` (default: the run's ``hardware.dtype``); a run trained over a 4-bit NF4 base
(``model.quantization=4bit``) is loaded on that base as it trained (bitsandbytes, so only on a CUDA GPU) and
dequantised (``pods.eval.merge``). OUT gets config.json, generation_config.json, model.safetensors (or shards with an
index), the run's tokenizer with its chat template, and ``pods_export.json``: the provenance (run directory,
checkpoint and step, the run's config hash as ``pods.launch.run_key`` computes it, pods version, what was merged).

OUT must not exist or be empty: nothing is overwritten. The directory is written as ``OUT.partial`` and renamed when
complete, so a failure leaves no half model behind. Bad input (RUN not a pods run, an unknown checkpoint, a non-empty
OUT, a 4-bit run without a GPU) is one line and exit code 2, before any model loads.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from pods.errors import ConfigError
from pods.numerics import pin

USAGE = "pods-export RUN [--checkpoint step_N.pt|latest] [--dtype float32|bfloat16|float16] OUT"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pods-export", usage=USAGE, description=__doc__.split("\n\n")[0])
    p.add_argument("run", metavar="RUN", help="a pods run directory (its config.json, final/ or checkpoints/)")
    p.add_argument("out", metavar="OUT", type=Path, help="the model directory to write (must not exist, or be empty)")
    p.add_argument("--checkpoint", default=None, help="a file under RUN/checkpoints/ or 'latest' (default: final/, else the newest)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default: the run's hardware.dtype")
    return p.parse_args(argv)


def check_out(out: Path) -> Path:
    """``out`` when it can be written and holds nothing; ``ConfigError`` in one line otherwise."""
    from pods.files import writable

    writable(out, "OUT", directory=True)
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"OUT: {out} is not empty: pods-export writes a new directory (or into an empty one) and overwrites nothing")
    if out.with_name(out.name + ".partial").exists():
        raise ConfigError(f"OUT: {out}.partial exists (an export that did not finish?): delete it first")
    return out


def check_target(run: str, checkpoint: str | None):
    """The run's weights resolved (``pods.eval.weights.resolve``), refused in one line before any model loads."""
    from pods.eval.weights import quantization, resolve, run_config

    if not Path(run).is_dir() or run_config(Path(run)) is None:
        raise ConfigError(f"RUN: '{run}' is not a pods run directory (no pods config.json there)")
    target = resolve(run, checkpoint)
    if quantization(target) == "4bit":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{run} trained on a 4-bit base (model.quantization=4bit): dequantising it needs bitsandbytes on a CUDA GPU")
    return target


def weights_step(target) -> int | None:
    """The training step of the weights: a checkpoint's from its name (step_N.pt), ``final/``'s from the run's last
    training row in metrics.jsonl (None without one)."""
    from pods.eval.weights import last_step

    if target.kind == "checkpoint":
        found = re.search(r"step_(\d+)", target.weights.name)
        return int(found.group(1)) if found else None
    return last_step(target.run_dir)


def provenance(target, dtype: str, tensors: list[str]) -> dict:
    """What ``pods_export.json`` says: where the weights came from and what was done to them."""
    import pods
    from pods.eval.weights import quantization
    from pods.launch import run_key

    return {
        "run_dir": str(target.run_dir.resolve()),
        "weights": str(target.weights.resolve()),
        "kind": target.kind,  # "final" (RUN/final) | "checkpoint" (RUN/checkpoints/step_N.pt)
        "checkpoint": target.weights.name if target.kind == "checkpoint" else None,
        "step": weights_step(target),
        "config_hash": run_key(target.run_cfg),  # pods.launch.run_key: SHA-256 of the resolved config without bookkeeping keys
        "pods_version": pods.__version__,
        "base_model": target.base,
        "lora_merged": target.lora is not None,
        "base_dequantised_from": quantization(target),
        "dtype": dtype,
        "tensors": len(tensors),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def export(target, out: Path, dtype: str) -> dict:
    """Write ``target``'s weights as a plain model directory at ``out`` (via ``out``.partial); the provenance."""
    from pods.eval.merge import write_plain
    from pods.eval.weights import load, quantization
    from pods.models import load_tokenizer

    quantized = quantization(target) == "4bit"
    if quantized:  # the base as it trained: NF4 on the GPU, its other tensors and dequantised values in the run's dtype
        model, _ = load(target, "cuda", target.run_cfg["hardware"].get("dtype", "bfloat16"), quantized=True)
    else:  # the run's dtype: its stored weights exactly, at half float32's host memory for a bf16 run (30 GB at 7B
        # otherwise); a LoRA delta is summed in float32 all the same and the sum rounded once to dtype (pods.eval.merge)
        model, _ = load(target, "cpu", target.run_cfg["hardware"].get("dtype", "float32"))
    tok = load_tokenizer(target.tokenizer or target.base)
    partial = out.with_name(out.name + ".partial")
    try:
        tensors = write_plain(model, partial, dtype, tok)
        note = provenance(target, dtype, tensors)
        (partial / "pods_export.json").write_text(json.dumps(note, indent=2) + "\n")
        if out.is_dir():
            out.rmdir()  # empty (check_out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return note


def main(argv: list[str] | None = None) -> int:
    pin()  # the CPU numerics, before anything loads torch (pods.numerics)
    args = parse_args(argv)
    try:  # everything checked before a model loads
        out = check_out(args.out)
        target = check_target(args.run, args.checkpoint)
        dtype = args.dtype or (target.run_cfg.get("hardware") or {}).get("dtype") or "float32"
        note = export(target, out, dtype)
    except ConfigError as e:
        print(f"pods-export: {e}", file=sys.stderr)
        return 2
    what = f"{note['checkpoint'] or 'final/'} (step {note['step']})" + (", LoRA merged" if note["lora_merged"] else "")
    print(f"pods-export: {args.run}: {what}, {note['tensors']} tensors in {dtype} -> {out}")
    print(f"load it with AutoModelForCausalLM.from_pretrained('{out}') or vllm.LLM(model='{out}')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
