"""The checks of scripts/gpu_smoke.sh that are not a pods command (GPU only; ``--help`` lists them).

    python scripts/gpu_smoke_checks.py triton           a Triton kernel compiled and run, against torch
    python scripts/gpu_smoke_checks.py lora_merge       4-bit LoRA: pods' exported merge against peft's own merge
    python scripts/gpu_smoke_checks.py steps RUN N      RUN's metrics.jsonl has N training rows (and its suite's files)

Each prints one line that says what it measured and exits 1 when the check fails; 2 (one line) on bad input or
without CUDA.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

MERGE_TOL = 1e-6  # float32 weights: the same dequantised W + scale B A summed in another order
LOGIT_TOL = 1e-3  # float32 logits: a 4-bit peft model's forward vs a plain model holding the exported weights


def triton_check() -> str:
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = i < n
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=keep) + tl.load(y_ptr + i, mask=keep), mask=keep)

    x, y = torch.randn(100_003, device="cuda"), torch.randn(100_003, device="cuda")
    out = torch.empty_like(x)
    add[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y), "the Triton kernel's sum differs from torch's"
    return f"triton {triton.__version__}: a kernel compiled and ran on {torch.cuda.get_device_name()}, equal to torch"


def lora_backend():
    from pods.backends.local import LocalBackend
    from pods.compose import compose_plain
    from pods.schema import check
    from pods.tiny import ensure_tiny

    over = ["hardware=l40s_lora", "hardware.dtype=float32", "hardware.gpu_memory_gb=null", "model.quantization=4bit", "rollout=hf"]
    backend = LocalBackend(str(ensure_tiny()), check(compose_plain(over)))
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, p in backend.model.named_parameters():
        if "lora_B" in name:  # peft starts B at 0: give the merge something to add
            p.data = 0.02 * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype)
    return backend


def lora_merge_check() -> str:
    """Weights: pods' export (``LocalBackend.export_weights``) against peft's merge of each LoRA layer, i.e. its
    ``dequantize_bnb_weight`` + ``get_delta_weight``, the values ``merge()`` adds before re-quantising. Behaviour: the
    peft model's logits (NF4 base + adapters) against a plain model loaded with the exported weights."""
    from peft.utils.integrations import dequantize_bnb_weight
    from transformers import AutoModelForCausalLM

    backend = lora_backend()
    exported = {k: v.float() for k, v in backend.export_weights()}
    worst, layers = 0.0, 0
    for name, module in backend.model.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            base = module.base_layer.weight
            ref = dequantize_bnb_weight(base, getattr(base, "quant_state", None)).float()
            ref = ref + sum(module.get_delta_weight(a).float() for a in module.active_adapters)
            hf = name.replace("base_model.model.", "", 1) + ".weight"
            worst, layers = max(worst, float((exported[hf] - ref).abs().max())), layers + 1
    plain = AutoModelForCausalLM.from_pretrained(backend.model_dir, dtype=torch.float32).cuda()
    missing = plain.load_state_dict(exported, strict=False).missing_keys
    ids = torch.randint(3, plain.config.vocab_size, (2, 24), device="cuda")
    with torch.no_grad():
        gap = float((backend.model(input_ids=ids).logits.float() - plain(input_ids=ids).logits).abs().max())
    ok = layers > 0 and worst <= MERGE_TOL and gap <= LOGIT_TOL and not [k for k in missing if "lm_head" not in k]
    line = f"4-bit LoRA: {layers} layers, max |export - peft merge| {worst:.3g} (<= {MERGE_TOL}), max logit gap {gap:.3g} (<= {LOGIT_TOL})"
    if not ok:
        raise SystemExit(f"FAIL {line}; missing {missing[:3]}")
    return line


def steps_check(run: str, n: int) -> str:
    from pods.metrics import read_metrics

    rows = read_metrics(Path(run) / "metrics.jsonl", "train")
    suite = sorted(str(p.relative_to(run)) for p in (Path(run) / "eval").rglob("*") if p.is_file()) if (Path(run) / "eval").is_dir() else []
    if len(rows) != n:
        raise SystemExit(f"FAIL {run}: {len(rows)} training rows, expected {n}")
    return f"{run}: {n} training rows; suite files: {', '.join(suite[:4]) or 'none'}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="check", required=True)
    sub.add_parser("triton")
    sub.add_parser("lora_merge")
    s = sub.add_parser("steps")
    s.add_argument("run")
    s.add_argument("n", type=int)
    a = p.parse_args(argv)
    if not torch.cuda.is_available() and a.check != "steps":
        p.error(f"{a.check} needs a CUDA device (torch {torch.__version__} sees none)")
    if a.check == "steps" and not (Path(a.run) / "metrics.jsonl").is_file():
        p.error(f"{a.run}: no metrics.jsonl (the run did not start, or this is not a run directory)")
    print({"triton": triton_check, "lora_merge": lora_merge_check}.get(a.check, lambda: steps_check(a.run, a.n))())


if __name__ == "__main__":
    sys.exit(main())
