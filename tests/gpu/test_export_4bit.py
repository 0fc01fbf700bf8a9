"""``pods-export`` of a LoRA run trained over a 4-bit NF4 base. Needs a CUDA GPU (bitsandbytes' 4-bit kernels): marked
``gpu`` and skipped without one (``make gpu-check``); started once on an H200 but cut by the smoke step's
limit, so not yet run to the end.

A tiny LoRA run on a 4-bit base, two steps on CUDA through ``python -m pods.train``; its export must hold, for every
LoRA target, the dequantised NF4 weight plus the adapter's delta summed in float32 and rounded once to bfloat16 (what
the run trained: the base as bitsandbytes dequantises it, not the full-precision W), every other tensor as the 4-bit
model holds it, and its logits must match the 4-bit model under its adapter within bfloat16 rounding."""

from __future__ import annotations

import json

import pytest
import torch

from support.runs import python, train_run

pytestmark = pytest.mark.gpu

QLORA = [
    "hardware.device=cuda",
    "hardware.dtype=bfloat16",
    "model.quantization=4bit",
    "train.max_steps=2",
    "train.checkpoint_every_steps=null",
]


def test_a_4bit_lora_run_exports_dequantised_and_merged(tiny_dir, tmp_path):
    from peft import PeftModel
    from peft.utils.integrations import dequantize_module_weight
    from transformers import AutoModelForCausalLM

    from pods.eval.weights import quantized_base, resolve

    run = train_run(tmp_path / "run", "lora", QLORA)
    out = tmp_path / "out"
    p = python(["-m", "pods.export", str(run), str(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    note = json.loads((out / "pods_export.json").read_text())
    assert note["base_dequantised_from"] == "4bit" and note["lora_merged"] and note["dtype"] == "bfloat16"
    assert "quantization_config" not in json.loads((out / "config.json").read_text())

    target = resolve(str(run))
    trained = PeftModel.from_pretrained(quantized_base(target, "cuda", "bfloat16"), str(run / "final")).eval()
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16).to("cuda").eval()
    ours = exported.state_dict()
    checked = 0
    for name, module in trained.get_base_model().named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight"):
            w = dequantize_module_weight(module.base_layer).float()
            want = (w + sum(module.get_delta_weight(a).float() for a in module.active_adapters)).to(torch.bfloat16)
            assert torch.equal(ours[f"{name}.weight"], want), name
            checked += 1
    assert checked > 0
    ids = torch.randint(0, exported.config.vocab_size, (2, 24), device="cuda")
    with torch.no_grad():
        gap = (exported(ids).logits.float() - trained(input_ids=ids).logits.float()).abs().max().item()
    assert gap < 0.1, gap  # bfloat16 logits of two roundings of the same function (one ulp at |logit| ~ 10 is 0.06)
