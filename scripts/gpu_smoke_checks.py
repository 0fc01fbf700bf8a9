"""The checks of scripts/gpu_smoke.sh that are not a pods command (GPU only; ``--help`` lists them).

    python scripts/gpu_smoke_checks.py triton           a Triton kernel compiled and run, against torch
    python scripts/gpu_smoke_checks.py lora_merge       4-bit LoRA: pods' exported merge against peft's own merge
    python scripts/gpu_smoke_checks.py steps RUN N      RUN's metrics.jsonl has N training rows (and its suite's files)
    torchrun --nproc_per_node 1 scripts/gpu_smoke_checks.py accum
                                                       ZeRO-3 micro-batch accumulation: fp32, bf16, bf16 + fp32 sums
    python scripts/gpu_smoke_checks.py suite_child OUT  a run's memory given back, then the suite's spawned child on CUDA
    python scripts/gpu_smoke_checks.py export RUN DIR   a 4-bit run's pods-export against pods-eval's loader (logits)

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


def full_grads(backend) -> dict:
    from deepspeed.utils import safe_get_full_grad

    return {n: safe_get_full_grad(p).float().cpu() for n, p in backend.engine.module.named_parameters()}


def accum_grads(overrides: list[str], micro: int, each: bool) -> tuple[dict, list[dict]]:
    """(accumulated, per-micro-batch) full gradients of one ZeRO-3 update on 16 fixed rows (tests/distributed's
    test_grad_accum_on_cpu.py, on CUDA and one rank)."""
    from pods.backends import build_batch
    from pods.backends.deepspeed import DeepSpeedBackend
    from pods.compose import compose_plain
    from pods.schema import check
    from pods.tiny import ensure_tiny

    over = ["hardware=h100x8_zero3", "hardware.nproc_per_node=1", "hardware.gpu_memory_gb=null", "algorithm=grpo", "rollout=hf"]
    backend = DeepSpeedBackend(str(ensure_tiny()), check(compose_plain([*over, *overrides, f"hardware.micro_batch_size={micro}"])))
    parts, result, real = [], {}, backend.backward

    def backward(loss):
        real(loss)
        if each:
            parts.append(full_grads(backend))
            backend.engine.optimizer.zero_grad()

    backend.backward, backend.optimizer_step = backward, lambda lr: result.update(full_grads(backend)) or 0.0
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 290, (int(k),), generator=g).tolist() for k in torch.randint(3, 9, (16,), generator=g)]
    done = [torch.randint(10, 290, (int(k),), generator=g).tolist() for k in torch.randint(1, 13, (16,), generator=g)]
    backend.update(build_batch(prompts, done, [[0.0] * len(c) for c in done], torch.randn(16, generator=g), 0), 1.0)
    return result, parts


def rel_gap(a: dict, b: dict) -> float:
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b)
    return (num / sum(float(b[k].double().pow(2).sum()) for k in b)) ** 0.5


def accum_check() -> str:
    from pods import distributed
    from pods.compose import compose_plain
    from pods.schema import check

    distributed.init(check(compose_plain(["hardware=h100x8_zero3", "hardware.nproc_per_node=1"])).hardware)
    variants = {"fp32": ["hardware.dtype=float32"], "bf16 (bf16 sums)": ["+hardware.deepspeed.config.data_types.grad_accum_dtype=bf16"],
                "bf16 (fp32 sums)": []}  # fmt: skip
    gaps = {name: rel_gap(accum_grads(o, 1, False)[0], accum_grads(o, 16, False)[0]) for name, o in variants.items()}
    parts = accum_grads([], 1, True)[1]
    total = {k: v.clone() for k, v in parts[0].items()}
    for part in parts[1:]:  # in DeepSpeed's order: the first micro-batch copied, the others added
        for k in total:
            total[k] += part[k]
    exact = rel_gap(accum_grads([], 1, False)[0], total)
    line = "ZeRO-3 16x1 vs 1x16 rows, relative gradient gap: " + ", ".join(f"{k} {v:.2e}" for k, v in gaps.items())
    line += f"; bf16 16x1 vs the fp32 sum of its micro-batches {exact:.2e}"
    if gaps["fp32"] > 1e-5 or exact > 1e-6:
        raise SystemExit(f"FAIL {line}")
    return line


def suite_child_check(out: str) -> str:
    """One training step of the tiny model on CUDA in this process, then what it left allocated, whether its engines
    are gone (``pods.engines.base.alive``), and the end-of-run suite in a spawned clean process on CUDA."""
    from pods.compose import compose_plain
    from pods.config import validate
    from pods.engines.base import alive
    from pods.eval import end, shards
    from pods.loop import train

    over = ["hardware=l40s_lora", "hardware.finetune=full", "hardware.gpu_memory_gb=null", "optim.name=adamw", "rollout=hf"]
    over += [
        "algorithm.n=4",
        "algorithm.m=2",
        "train.max_steps=1",
        "train.time_budget_s=null",
        "eval.at_start=false",
        "eval.max_examples=8",
    ]
    over += [
        "eval.suite=toy",
        "eval.suite_overrides=['suite.only=[toy_arith]','suite.benchmarks.toy_arith.size=8','suite.samples=1']",
        "train.save_final=true",
    ]
    cfg = validate(compose_plain(over))
    prepared = end.prepare(cfg)
    train(cfg, out)
    left, held = alive(), torch.cuda.memory_allocated() / 2**20
    torch.cuda.empty_cache()
    summary = shards.evaluate_shared(*prepared[:1], out, end.options(cfg, prepared[0]), prepared[1], Path(out) / "eval" / "toy", (0, 0, 1))
    line = f"after training: {held:.0f} MiB allocated, alive {left or 'none'}; suite child on CUDA: macro avg@n {summary['macro']['avg@n']:.3f}"
    if left or held > 256:
        raise SystemExit(f"FAIL {line}")
    return line


def export_check(run: str, exported: str) -> str:
    """The 4-bit run's ``pods-export`` directory against ``pods-eval``'s loader of the same run (its adapter over the
    NF4 base, ``pods.eval.weights.load(quantized=True)``): the same logits up to bf16 rounding."""
    from transformers import AutoModelForCausalLM

    from pods.eval.weights import load, resolve

    target = resolve(run)
    model, _ = load(target, "cuda", "bfloat16", quantized=True)
    plain = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(3, plain.config.vocab_size, (2, 24), device="cuda")
    with torch.no_grad():
        a, b = model(input_ids=ids).logits.float(), plain(input_ids=ids).logits.float()
    gap, scale = float((a - b).abs().max()), float(a.abs().max())
    line = f"4-bit run: pods-export vs pods-eval's loader, max logit gap {gap:.3g} of max |logit| {scale:.3g}"
    if gap > 0.05 * max(scale, 1.0):
        raise SystemExit(f"FAIL {line}")
    return line


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="check", required=True)
    sub.add_parser("triton")
    sub.add_parser("lora_merge")
    s = sub.add_parser("steps")
    s.add_argument("run")
    s.add_argument("n", type=int)
    sub.add_parser("accum")
    sub.add_parser("suite_child").add_argument("out")
    e = sub.add_parser("export")
    e.add_argument("run")
    e.add_argument("exported")
    a = p.parse_args(argv)
    if not torch.cuda.is_available() and a.check != "steps":
        p.error(f"{a.check} needs a CUDA device (torch {torch.__version__} sees none)")
    if a.check == "steps" and not (Path(a.run) / "metrics.jsonl").is_file():
        p.error(f"{a.run}: no metrics.jsonl (the run did not start, or this is not a run directory)")
    checks = {"triton": triton_check, "lora_merge": lora_merge_check, "accum": accum_check, "steps": lambda: steps_check(a.run, a.n)}
    checks |= {"suite_child": lambda: suite_child_check(a.out), "export": lambda: export_check(a.run, a.exported)}
    print(checks[a.check]())


if __name__ == "__main__":
    sys.exit(main())
