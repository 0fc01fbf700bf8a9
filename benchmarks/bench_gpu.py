"""The GPU check: Figure 1 of the paper measured on this machine, and the real training loop with a sampler/trainer
log-prob check after every weight sync. Runs on any CUDA machine with no network and no download; runs on CPU
with small sizes (``tests/gpu/test_bench_gpu.py``), so it is known to work before it meets a GPU.

    python benchmarks/bench_gpu.py [--device auto|cpu|cuda] [--small] [--engine auto|vllm|hf] --out results/gpu

1. Models: random-initialised models of the exact architectures of Qwen2.5-3B/7B-Instruct
   (``pods.architectures.ARCHITECTURES``; bf16 on CUDA), saved with the tiny model's tokenizer so that vLLM and
   ``from_pretrained`` load them like hub models (ids beyond that tokenizer decode to nothing: harmless for
   random weights). Timings and memory do not depend on trained weights. On CPU: the same layout shrunk
   (``CPU_ARCH``).
2. Figure 1(a), ``generation.csv``: wall time per generated token (prefill included) against rollouts per batch, every rollout exactly
   ``completion_len`` tokens (vLLM ``ignore_eos=True, min_tokens=max_tokens``; HF generate with no stop id),
   distinct random prompts of ``prompt_len`` tokens, with the fastest engine present (vLLM when importable on
   CUDA, else the project's HF engine).
3. Figure 1(b), ``update.csv``: one optimizer step of ``pods.backends.local.LocalBackend.update`` on a batch of
   b rollouts as one micro-batch, b = 1, 2, 4, ... until the first out-of-memory (CPU: ``max_micro``), full
   fine-tuning and LoRA; then the gradient-accumulation point: 2x the largest micro-batch that fit, as two
   micro-batches (``accum_steps`` 2). Peak memory is CUDA ``max_memory_allocated`` (reset per point) or, on CPU,
   the process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``): ``mem_kind`` says which.
4. ``loop.csv``: ``pods.loop.train`` for ``loop_steps`` steps on the tiny model, then (CUDA) the 3B architecture
   with LoRA (and on a 4-bit base when bitsandbytes is installed; CPU: the shrunk model with LoRA). The backend
   is the configured one with a probe around ``update``: before the step it scores the step's rollouts with the
   trainer (``gap_*``: trainer vs the sampler's log-probs, which came from the engine synced after the previous
   step), after the step again (``drift_mean_abs``: what the step moved; a sync that failed would leave a gap of
   that size; ``t_update`` includes the probe's two no-grad passes), beside the update's own ``sampler_gap`` /
   ``sampler_gap_max`` (``pods.backends.gap``: what every run logs; equal to ``gap_mean_abs`` / ``gap_max_abs``),
   plotted per step in panel (c) of figure1.png. Random-weight models get random +-1 advantages (their rewards are
   all 0) so every step moves them.

5. ``--step-cost`` (instead of 1-4): the loop's three arms, GRPO 16/16, PODS 64->16 and GRPO-GA 64 in micro-batches
   of 16, a few steps each, LoRA r = 64 and full fine-tuning, on a random 3B (CUDA) or the tiny model (CPU):
   ``step_cost.csv`` and ``step_summary.csv``, the file ``pods.demo``'s cost model reads (``benchmarks/step_cost.py``).

Sizes and model (defaults: the mode's, above): ``--rollouts 16,32,...`` the generation sweep's batch sizes,
``--micro-batches 1,2,4,...`` the update sweep's (the GA point stays at 2x the largest that fit), ``--models tiny``
the models measured (keys of ``LABELS``; ``tiny`` = the warm-started tiny model the CPU miniature trains, measured
on its own task: the toy prompts, completions of ``sampling.max_tokens`` tokens (12), the update under
``hardware=cpu_mb16``'s settings), ``--no-loop`` Figure 1 only. ``benchmarks/bench_figure1_cpu.py`` (``make
figure1-cpu``) runs it that way and adds the per-step view.

Each measurement runs in its own process (an out-of-memory or a vLLM engine never leaks into the next). Writes
``<out>/<gpu name | cpu>/``: generation.csv, update.csv, loop.csv, figure1.png (panels (a), (b) and, with the loop,
(c) sampler_gap per step), summary.txt; prints the summary.
Exit code 1 when a phase failed or a log-prob gap is above its tolerance.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, compose, short_run, typed  # noqa: E402  (the repository on sys.path; the config tree composed)

QWEN3B, QWEN7B = "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
MODELS_DIR = Path(os.environ.get("PODS_CACHE", ROOT / ".cache")) / "bench_models"  # not /tmp: often a small RAM disk
CPU_ARCH = dict(hidden_size=128, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=8192)
LABELS = {QWEN3B: "qwen2.5-3b", QWEN7B: "qwen2.5-7b", "cpu": "qwen2-cpu", "tiny": "tiny"}
GAP_TOL = {"float32": 1e-3, "bfloat16": 5e-2}  # mean |sampler - trainer| log-prob per token, after a sync: pods.backends.gap.AUTO_WARN
SETTINGS = {  # sizes per mode
    "cuda": dict(
        models=[QWEN3B, QWEN7B], batches=[8, 16, 32, 64, 128, 256, 512], prompt_len=128, completion_len=512, gen_repeats=1,
        update_completion_len=512, max_micro=4096, update_repeats=1, loop_steps=20, loop_tokens=128, n=16, m=8,
    ),
    "cuda-small": dict(
        models=[QWEN3B], batches=[8, 64], prompt_len=64, completion_len=64, gen_repeats=1,
        update_completion_len=128, max_micro=4, update_repeats=1, loop_steps=2, loop_tokens=32, n=8, m=4,
    ),
    "cpu": dict(
        models=["cpu"], batches=[1, 2, 4, 8, 16, 32], prompt_len=16, completion_len=32, gen_repeats=3,
        update_completion_len=64, max_micro=16, update_repeats=3, loop_steps=3, loop_tokens=12, n=8, m=4,
    ),
    "cpu-small": dict(
        models=["cpu"], batches=[2, 8], prompt_len=8, completion_len=16, gen_repeats=1,
        update_completion_len=32, max_micro=4, update_repeats=1, loop_steps=2, loop_tokens=8, n=4, m=2,
    ),
}  # fmt: skip


def now_s(device: str) -> float:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


# ---- 1. random-initialised models of the paper's architectures -----------------------------------------------
def architecture(key: str) -> dict:
    from pods.architectures import ARCHITECTURES

    return dict(ARCHITECTURES[key]) if key in ARCHITECTURES else {**ARCHITECTURES[QWEN3B], **CPU_ARCH}


def random_model(key: str, device: str, dtype):
    """A random-initialised model of architecture ``key`` on ``device`` (``meta``: shapes only), and the tiny tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from pods.tiny import ensure_tiny, load_tokenizer

    arch = architecture(key)
    tok = load_tokenizer(ensure_tiny())
    fields = {k: v for k, v in arch.items() if k not in ("architectures", "model_type", "torch_dtype")}
    cfg = AutoConfig.for_model(
        arch["model_type"], **fields, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    with torch.device(device):  # initialised where it will run: seconds for 7B on a GPU
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model, tok


def build_random_model(key: str, out_dir: Path, device: str, seed: int = 0) -> dict:
    """Save a random-initialised model of architecture ``key`` (bf16 on CUDA, fp32 on CPU) with the tiny tokenizer."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(seed)
    model, tok = random_model(key, device, dtype)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    return {"params_m": round(params / 1e6, 2), "dtype": str(dtype).removeprefix("torch."), "dir": str(out_dir),
            "vocab_size": model.config.vocab_size}  # fmt: skip


def tiny_model_info(device: str) -> dict:
    """The warm-started tiny model (``pods.tiny.ensure_tiny``, built on first use): trained weights, not random."""
    from transformers import AutoModelForCausalLM

    from pods.tiny import ensure_tiny

    path = ensure_tiny()
    model = AutoModelForCausalLM.from_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    return {"params_m": round(params / 1e6, 3), "dtype": "bfloat16" if device == "cuda" else "float32", "dir": str(path),
            "vocab_size": model.config.vocab_size}  # fmt: skip


def toy_setting(tok, count: int) -> tuple[list[list[int]], int, int]:
    """The CPU miniature's task for the tiny model: ``count`` distinct training prompts of the toy experiments
    (chat template applied, as the loop encodes them), their longest length, and the completion length
    ``sampling.max_tokens``."""
    from pods.tasks import DATASETS, encode_prompts

    cfg = typed(["experiment=toy_grpo_16_16_cpu"])
    ds = cfg.dataset
    ids, _, _ = encode_prompts(DATASETS.get(ds.name)(ds).train[:count], tok, ds.max_prompt_length)
    return ids, max(map(len, ids)), cfg.sampling.max_tokens


def phase_build(a, out: dict) -> None:
    import torch

    out["models"] = {
        key: tiny_model_info(a.device) if key == "tiny" else build_random_model(key, Path(a.models_dir) / LABELS[key], a.device)
        for key in a.setting["models"]
    }
    if a.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        out["device_name"], out["device_mem_gib"] = p.name, round(p.total_memory / 2**30, 1)
    else:
        out["device_name"], out["device_mem_gib"] = "cpu", round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    versions = {"torch": torch.__version__}
    for mod in ("transformers", "vllm", "peft"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    out["versions"] = versions


# ---- 2. Figure 1(a): generation time per token against rollouts per batch ---------------------------------------
def gen_engine(a, model_dir: str, tok, batches: list[int], length: int):
    """The project's engine for this model: ``vllm`` (its settings, one batch of up to max(batches) sequences) or ``hf``."""
    from pods.engines import ENGINES
    from pods.models import load_policy

    s = a.setting
    over = [f"hardware.device={a.device}", f"hardware.dtype={a.dtype}"]
    if a.gen_engine == "vllm":
        over += ["rollout=vllm", f"rollout.max_num_seqs={max(batches)}", f"rollout.max_model_len={s['prompt_len'] + length}"]
        over += ["rollout.gpu_memory_utilization=0.85"] if a.device == "cuda" else ["rollout.kv_cache_gib=0.5"]
        return ENGINES.get("vllm")(model_dir, tok, typed(over).rollout)
    cfg = typed([*over, "rollout=hf", f"rollout.max_batch={max(batches)}"])
    policy = load_policy(model_dir, cfg.hardware).to(a.device)
    engine = ENGINES.get("hf")(model_dir, tok, cfg.rollout, policy=policy)
    engine.stop_ids = set()  # EOS ignored: no stop id, every rollout runs to max_tokens
    return engine


def generate_fixed(engine, prompts: list[list[int]], length: int) -> int:
    """One rollout per prompt, exactly ``length`` tokens each (EOS ignored); returns the tokens generated."""
    from pods.engines import Sampling

    if hasattr(engine, "llm"):  # vLLM: the engine's LLM, with a request that cannot stop early
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            temperature=1.0, max_tokens=length, min_tokens=length, ignore_eos=True, logprobs=0, flat_logprobs=True, detokenize=False
        )
        outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)
    return engine.generate(prompts, 1, Sampling(temperature=1.0, max_tokens=length)).num_tokens


def phase_generation(a, out: dict) -> None:
    import torch

    from pods.models import load_tokenizer

    s, info = a.setting, a.model_info
    tok = load_tokenizer(info["dir"])
    L, P = s["completion_len"], s["prompt_len"]
    if a.model == "tiny":  # its own task's prompts and completion length
        prompts, P, L = toy_setting(tok, max(s["batches"]))
    else:
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, len(tok), (max(s["batches"]), P), generator=g).tolist()
    engine = gen_engine(a, info["dir"], tok, s["batches"], L)
    eager = hasattr(engine, "llm") and engine.llm.llm_engine.vllm_config.model_config.enforce_eager
    name = ("vllm (eager)" if eager else "vllm (CUDA graphs)") if hasattr(engine, "llm") else "hf generate"
    generate_fixed(engine, prompts[: s["batches"][0]], L)  # warm-up: first-call kernels and allocations
    rows = out["rows"] = []
    for b in s["batches"]:
        times, tokens, status = [], 0, "ok"
        try:
            for _ in range(s["gen_repeats"]):
                t0 = now_s(a.device)
                tokens = generate_fixed(engine, prompts[:b], L)
                times.append(now_s(a.device) - t0)
        except torch.OutOfMemoryError:
            status = "oom"
        sec = statistics.median(times) if times else float("nan")
        rows.append({"model": LABELS[a.model], "params_m": info["params_m"], "dtype": a.dtype, "engine": name, "rollouts": b,
                     "prompt_len": P, "completion_len": L, "seconds": sec, "tokens": tokens,
                     "per_token_ms": 1e3 * sec / max(tokens, 1), "per_rollout_s": sec / b, "tokens_per_s": tokens / sec if times else 0.0,
                     "repeats": len(times), "status": status})  # fmt: skip
        if status == "oom":
            break
        assert tokens == b * L, f"expected {b} x {L} tokens, got {tokens}: EOS was not ignored"


# ---- 3. Figure 1(b): update time and peak memory against rollouts per micro-batch -------------------------------
class PeakMemory:
    """Peak memory of a measured region: CUDA's allocator peak, or the CPU process's peak RSS (VmHWM)."""

    def __init__(self, device: str):
        self.device = device
        self.kind = "cuda_max_memory_allocated" if device == "cuda" else "cpu_peak_rss"
        if device == "cpu":  # glibc: blocks >= 64 KiB mmapped and unmapped on free (no dynamic threshold), so RSS tracks live tensors
            import ctypes

            ctypes.CDLL("libc.so.6").mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD

    @staticmethod
    def _status_mib(key: str) -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"/proc/self/status has no {key}")

    def reset(self) -> float:
        """Start a region; returns the memory held at its start (MiB)."""
        import torch

        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated() / 2**20
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages back to the OS: the next peak is this region's
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        return self._status_mib("VmRSS")

    def now(self) -> float:
        return now_s(self.device)

    def peak(self) -> float:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        return self._status_mib("VmHWM")


def update_batch(rollouts: int, P: int, C: int, vocab: int, seed: int):
    """``rollouts`` random sequences of P prompt + C completion tokens, random +-1 advantages (a TrainBatch)."""
    import torch

    from pods.backends import build_batch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rollouts, P + C), generator=g).tolist()
    adv = torch.randint(0, 2, (rollouts,), generator=g).float() * 2 - 1
    return build_batch([r[:P] for r in ids], [r[P:] for r in ids], [[0.0] * C] * rollouts, adv, pad_id=0)


def update_backend(a, model_dir: str):
    """``LocalBackend`` as the loop builds it: the single-GPU profile (gradient checkpointing, chunked log-probs)."""
    from pods.backends.local import LocalBackend

    if a.device == "cuda":
        over = ["hardware=l40s_lora"]
    else:  # the tiny model: as the CPU miniature trains it (no gradient checkpointing)
        over = ["hardware=cpu_mb16"] if a.model == "tiny" else ["hardware=cpu", "hardware.gradient_checkpointing=true"]
    over += [f"hardware.finetune={a.finetune}", f"hardware.dtype={a.dtype}", f"hardware.device={a.device}", f"optim.name={optimizer(a)}"]
    over += ["rollout=hf"]  # the engine is not built here
    return LocalBackend(model_dir, typed(over))


def optimizer(a) -> str:
    """The paper's single-GPU 8-bit AdamW where bitsandbytes is installed (CUDA), else torch's AdamW."""
    return "adamw_8bit" if a.device == "cuda" and _importable("bitsandbytes") else "adamw"


def measure_update(backend, mem: PeakMemory, batch, micro: int, repeats: int, device: str) -> dict:
    """Time (median of ``repeats``) and peak memory (max) of ``backend.update`` on ``batch`` in micro-batches of ``micro``."""
    times, peak, static, norm = [], 0.0, 0.0, 0.0
    for _ in range(repeats):
        static = mem.reset()
        t0 = now_s(device)
        norm = backend.update(batch, lr=1e-6, micro_batch_size=micro)["grad_norm"]
        times.append(now_s(device) - t0)
        peak = max(peak, mem.peak())
    return {"seconds": statistics.median(times), "mem_static_mib": static, "mem_peak_mib": peak, "grad_norm": norm}


def phase_update(a, out: dict) -> None:
    import torch

    s, info, mem = a.setting, a.model_info, PeakMemory(a.device)
    P, C = s["prompt_len"], s["update_completion_len"]
    if a.model == "tiny":  # the toy task's lengths (random token ids, as for the other models)
        from pods.models import load_tokenizer

        _, P, C = toy_setting(load_tokenizer(info["dir"]), 1)
    vocab = info["vocab_size"]
    backend = update_backend(a, info["dir"])
    base = {"model": LABELS[a.model], "params_m": info["params_m"], "dtype": a.dtype, "finetune": a.finetune, "optimizer": optimizer(a),
            "grad_ckpt": bool(backend.model.is_gradient_checkpointing), "seq_len": P + C, "mem_kind": mem.kind}  # fmt: skip
    rows = out["rows"] = []

    def point(batch_size: int, micro: int) -> bool:
        oom = False
        try:
            r = measure_update(backend, mem, update_batch(batch_size, P, C, vocab, batch_size), micro, s["update_repeats"], a.device)
        except torch.OutOfMemoryError:
            oom = True
        if oom:  # outside the handler: its traceback no longer pins the activations
            backend.optimizer.zero_grad(set_to_none=True)
            mem.reset()
            r = {"seconds": float("nan"), "mem_static_mib": float("nan"), "mem_peak_mib": float("nan"), "grad_norm": float("nan")}
        rows.append({**base, "batch": batch_size, "micro_batch": micro, "accum_steps": batch_size // micro, **r,
                     "s_per_rollout": r["seconds"] / batch_size, "mem_update_mib": r["mem_peak_mib"] - r["mem_static_mib"],
                     "status": "oom" if oom else "ok"})  # fmt: skip
        return not oom

    if not point(1, 1):  # also the warm-up: the optimizer state is allocated at the first step
        return
    rows.pop()
    fit = 0
    for b in s["micro_batches"]:
        if not point(b, b):
            break
        fit = b
    if fit:
        point(2 * fit, fit)  # the gradient-accumulation point: twice the largest micro-batch that fit, as two


# ---- 4. the real loop, with the sampler/trainer log-prob probe -------------------------------------------------
def probed(cls):
    """``cls`` with a probe around ``update``: the trainer's log-probs of the step's rollouts before the step (vs the
    sampler's: ``gap_*``) and after it (``drift_mean_abs``), added to the step's metrics row."""

    class Probed(cls):
        def update(self, batch, lr, micro_batch_size=None, progress=False):
            before = self.policy_logprobs(batch)
            stats = super().update(batch, lr, micro_batch_size, progress)
            after = self.policy_logprobs(batch)
            mask = batch.loss_mask > 0
            gap = (batch.sampler_logprobs - before)[mask]
            return {**stats, "gap_mean_abs": float(gap.abs().mean()), "gap_max_abs": float(gap.abs().max()), "gap_mean": float(gap.mean()),
                    "drift_mean_abs": float((after - before)[mask].abs().mean())}  # fmt: skip

    return Probed


def random_sign(rewards):
    """+-1 advantages for models whose rewards are all 0 (random weights): every step then moves the policy. [G, m] -> [G, m]."""
    import torch

    return torch.randint(0, 2, rewards.shape, generator=random_sign.gen).to(rewards.dtype) * 2 - 1


def loop_config(a, steps: int) -> dict:
    s, cuda = a.setting, a.device == "cuda"
    over = [f"rollout={a.loop_engine}", f"algorithm.n={s['n']}", f"algorithm.m={s['m']}", *short_run(steps, s["loop_tokens"])]
    over += [f"sampling.max_tokens={s['loop_tokens']}", f"eval.max_tokens={s['loop_tokens']}"]  # composed in: vLLM's max_model_len follows
    over += ["rollout.kv_cache_gib=0.25"] if a.loop_engine == "vllm" and not cuda else []
    if a.model == "tiny":
        over += [f"hardware.device={a.device}", f"hardware.dtype={a.dtype}"]
    else:  # the single-GPU paper setting (LoRA r = alpha = 64, colocated vLLM) on a random model: random +-1 advantages
        over += ["hardware=l40s_lora"] if cuda else ["hardware.finetune=lora"]
        over += ["model=qwen2_5_3b_instruct", f"model.path={a.model_info['dir']}", f"optim.name={optimizer(a)}", "optim.lr=1e-3"]
        over += ["algorithm.advantage=bench_random_sign", f"model.quantization={'4bit' if a.finetune == 'lora4bit' else 'null'}"]
    cfg = compose(over)
    if not cuda:  # the caller's thread count (OMP_NUM_THREADS), not the CPU profile's 2: spinning threads on a shared machine
        cfg["hardware"]["torch_threads"] = __import__("torch").get_num_threads()
    cfg["hardware"]["backend"] = "bench_probe_" + cfg["hardware"]["backend"]
    return cfg


def phase_loop(a, out: dict) -> None:
    import torch

    from pods.advantages import ADVANTAGES
    from pods.backends import BACKENDS
    from pods.config import validate
    from pods.loop import train
    from pods.metrics import read_metrics

    if "bench_probe_local" not in BACKENDS:
        BACKENDS.register("bench_probe_local", probed(BACKENDS.get("local")))  # the single-process backend, probed
    random_sign.gen = torch.Generator().manual_seed(0)
    ADVANTAGES.register("bench_random_sign", random_sign)
    cfg = loop_config(a, a.setting["loop_steps"])
    with tempfile.TemporaryDirectory(prefix="pods-bench-loop-") as run_dir:
        last = train(validate(cfg), run_dir)
        steps = read_metrics(Path(run_dir) / "metrics.jsonl", "train")
    ft = "lora (4-bit base)" if a.finetune == "lora4bit" else cfg["hardware"]["finetune"]
    keys = ("step", "train_time", "t_generate", "t_update", "t_sync", "reward_mean_all", "loss", "grad_norm", "tokens", "kept",
            "gap_mean_abs", "gap_max_abs", "gap_mean", "drift_mean_abs", "sampler_gap", "sampler_gap_max")  # fmt: skip
    out["rows"] = [{"model": LABELS[a.model], "engine": cfg["rollout"]["name"], "finetune": ft, "dtype": cfg["hardware"]["dtype"],
                    **{k: r[k] for k in keys}} for r in steps]  # fmt: skip
    out["eval_accuracy"] = last.get("accuracy")


# ---- 5. --step-cost: the loop's three arms per step (benchmarks/step_cost.py) ----------------------------------
def phase_steps(a, out: dict) -> None:
    import step_cost
    import torch

    from pods.advantages import ADVANTAGES

    random_sign.gen = torch.Generator().manual_seed(0)
    if "bench_random_sign" not in ADVANTAGES:
        ADVANTAGES.register("bench_random_sign", random_sign)
    a.optimizer = optimizer(a)
    step_cost.measure(a, out, compose, PeakMemory)


def measure_step_cost(a, parts: Path, info: dict, out_dir: Path) -> int:
    """``--step-cost``: one process per finetune (LoRA, full), then step_cost.csv, step_summary.csv, step_cost.txt."""
    import step_cost

    model = a.setting["models"][0]
    rows, errors = [], []
    for ft in ("lora", "full"):
        res = run_phase(a, "steps", parts / f"steps_{ft}.json", model=model, finetune=ft, model_info=info["models"][model])
        rows += res.get("rows", [])
        errors += [f"steps {ft}: {res['error'].splitlines()[-1]}"] if "error" in res else []
    write_csv(out_dir / "step_cost.csv", [{"device": info["device_name"], **r} for r in rows])
    summary = step_cost.summarise(rows, LABELS[model]) if rows else []
    write_csv(out_dir / "step_summary.csv", [{"device": info["device_name"], **r} for r in summary])
    text = step_cost.table(summary, info["device_name"]) + "".join(f"FAILED: {e}\n" for e in errors)
    (out_dir / "step_cost.txt").write_text(text)
    print(text, end="")
    print(f"[bench_gpu] wrote {out_dir}/step_summary.csv")
    return 1 if errors or not summary else 0


# ---- the figure: two panels like the paper's Figure 1 ----------------------------------------------------------
def gap_panel(ax, loop: list[dict]) -> None:
    """(c) the update's own ``sampler_gap`` per step of each loop run (solid), against what one step moved the
    trainer's log-probs (``drift_mean_abs``, dotted: the gap a stale engine would show) and the warning's threshold."""
    for key in dict.fromkeys((r["model"], r["finetune"]) for r in loop):
        rows = [r for r in loop if (r["model"], r["finetune"]) == key]
        steps = [r["step"] for r in rows]
        (line,) = ax.plot(steps, [r["sampler_gap"] for r in rows], "o-", label=f"{' '.join(key)} ({rows[0]['engine']}, {rows[0]['dtype']})")
        ax.plot(steps, [r["drift_mean_abs"] for r in rows], ":", color=line.get_color(), alpha=0.7)
    for dtype in dict.fromkeys(r["dtype"] for r in loop):
        ax.axhline(GAP_TOL.get(dtype, 5e-2), color="grey", lw=0.8, ls="--")
        ax.annotate(f"warning above ({dtype})", (0.02, GAP_TOL.get(dtype, 5e-2)), xycoords=("axes fraction", "data"), fontsize=7,
                    xytext=(0, 3), textcoords="offset points")  # fmt: skip
    ax.set(yscale="log", xlabel="training step", ylabel="mean |trainer - sampler| log-prob per token")
    ax.set_title("(c) sampler_gap after each sync (dotted: one step's drift)", fontsize=10)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")


def figure1(gen: list[dict], upd: list[dict], path: Path, title: str, info: dict, loop: list[dict] = ()) -> None:
    """(a) ms per generated token vs rollouts per batch; (b) update memory (solid; CUDA: peak allocated, CPU: peak RSS
    above the step's start) and seconds per step (dashed, right axis) vs rollouts per micro-batch, GA point starred;
    (c) with loop rows, ``sampler_gap`` per step (``gap_panel``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, 3 if loop else 2, figsize=(18 if loop else 12, 4.6))
    ax1, ax2 = axes[:2]
    if loop:
        gap_panel(axes[2], loop)
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    for model in dict.fromkeys(r["model"] for r in gen):
        rows = [r for r in gen if r["model"] == model and r["status"] == "ok"]
        if rows:
            ax1.plot([r["rollouts"] for r in rows], [r["per_token_ms"] for r in rows], "o-", label=f"{model} ({rows[0]['engine']})")
    ax1.set(yscale="log", xlabel="rollouts per batch", ylabel="generation time per token (ms)")
    ax1.set_title("(a) generation: fixed completion length, EOS ignored", fontsize=10)
    cuda = info.get("device_name") != "cpu"
    key_mem = "mem_peak_mib" if cuda else "mem_update_mib"
    ok = [r for r in upd if r["status"] == "ok"]
    unit, scale = ("GiB", 1 / 1024) if max((r[key_mem] for r in ok), default=0) > 4096 else ("MiB", 1.0)
    top = info["device_mem_gib"] * 1024 * scale if cuda else None
    times, labelled = ax2.twinx(), set()
    for key in dict.fromkeys((r["model"], r["finetune"]) for r in upd):
        rows = [r for r in upd if (r["model"], r["finetune"]) == key]
        plain = [r for r in rows if r["status"] == "ok" and r["accum_steps"] == 1]  # empty when even 1 rollout ran out of memory
        (line,) = ax2.plot([r["batch"] for r in plain], [r[key_mem] * scale for r in plain], "o-", label=" ".join(key))
        c = line.get_color()
        times.plot([r["batch"] for r in plain], [r["seconds"] for r in plain], "--", color=c, alpha=0.5)
        for r in rows:
            if r["accum_steps"] > 1 and r["status"] == "ok":
                ax2.plot(r["batch"], r[key_mem] * scale, "*", ms=14, color=c)
                times.plot(r["batch"], r["seconds"], "*", ms=9, color=c, alpha=0.5)
                if r["batch"] not in labelled:  # one label per GA point, however many series share it
                    labelled.add(r["batch"])
                    ga = f"GA {r['accum_steps']}x{r['micro_batch']}"
                    ax2.annotate(ga, (r["batch"], r[key_mem] * scale), fontsize=8, xytext=(-30, 8), textcoords="offset points")
            if r["status"] == "oom":
                y = top or max((p[key_mem] for p in plain), default=1.0) * scale * 1.1
                ax2.plot(r["batch"], y, "x", ms=10, mew=2, color=c)
                ax2.annotate("OOM", (r["batch"], y), fontsize=8, xytext=(4, -12), textcoords="offset points")
    if top:
        ax2.axhline(top, color="grey", lw=0.8, ls=":")
    what = "peak allocated" if cuda else "peak RSS above the step's start"
    ax2.set(xlabel="rollouts per micro-batch (GA point: per update)", ylabel=f"{what} ({unit}, solid)")
    times.set(ylabel="seconds per update step (dashed)")
    times.set_ylim(bottom=0)
    until = "until out of memory" if any(r["status"] == "oom" for r in upd) else "no out-of-memory up to the size cap"
    ax2.set_title(f"(b) policy update: full fine-tuning and LoRA, {until}", fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(fmt)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    ax1.yaxis.set_major_formatter(fmt)
    ax1.yaxis.set_minor_formatter(fmt)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- the driver: one process per measurement, then the CSVs, the figure and the summary --------------------------
PHASES = {"build": phase_build, "generation": phase_generation, "update": phase_update, "loop": phase_loop, "steps": phase_steps}


def run_phase(a, phase: str, result: Path, **job) -> dict:
    """Run ``phase`` in a fresh process (``--in-process``: in this one); returns its result, ``error`` set when it failed."""
    t0, res = time.perf_counter(), {}
    if a.in_process:
        try:
            PHASES[phase](argparse.Namespace(**{**vars(a), "phase": phase, "finetune": "full", "model_info": None, **job}), res)
        except Exception as e:  # noqa: BLE001 - reported like a failed process
            res["error"] = f"{type(e).__name__}: {e}"
    else:
        cmd = [sys.executable, __file__, *phase_args(a, phase, result, job)]
        proc = subprocess.run(cmd, timeout=a.phase_timeout, capture_output=True, text=True)
        res = json.loads(result.read_text()) if result.exists() else {}
        if proc.returncode != 0:
            res["error"] = f"exit {proc.returncode}: " + "\n".join(proc.stderr.strip().splitlines()[-15:])
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    label = " ".join(str(v) for v in job.values() if not isinstance(v, dict))
    print(f"[bench_gpu] {phase} {label}: {'FAILED' if 'error' in res else 'done'} in {res['wall_s']} s", flush=True)
    if "error" in res:
        print(res["error"], file=sys.stderr, flush=True)
    return res


def phase_args(a, phase: str, result: Path, job: dict) -> list[str]:
    """The command line of one measurement's process: the driver's device, engine and sizes (its ``setting``), and the job."""
    args = ["--phase", phase, "--result", str(result), "--device", a.device, "--engine", a.engine, "--models-dir", a.models_dir]
    args += ["--small"] if a.small else []
    args += ["--step-cost", f"--repeats={a.repeats}"] if a.step_cost else []
    args += [f"--models={','.join(a.models)}"] if a.models else []
    args += [f"--rollouts={_ints(a.rollouts)}"] if a.rollouts else []
    args += [f"--micro-batches={_ints(a.micro_batches)}"] if a.micro_batches else []
    return args + [f"--{k.replace('_', '-')}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in job.items()]


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.unlink(missing_ok=True)
        return
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows([{k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in r.items()} for r in rows])


def gap_checks(loop_rows: list[dict]) -> list[dict]:
    """Per loop run: the largest per-step mean |sampler - trainer| log-prob gap against the dtype's tolerance, as the
    probe measured it (``gap_mean_abs``) and as the update logs it on every run (``sampler_gap``; the two agree)."""
    out = []
    for key in dict.fromkeys((r["model"], r["finetune"]) for r in loop_rows):
        rows = [r for r in loop_rows if (r["model"], r["finetune"]) == key]
        gap, drift = max(r["gap_mean_abs"] for r in rows), statistics.median(r["drift_mean_abs"] for r in rows)
        logged = max(r["sampler_gap"] for r in rows)
        tol = GAP_TOL.get(rows[0]["dtype"], 5e-2)
        out.append({"model": key[0], "finetune": key[1], "engine": rows[0]["engine"], "dtype": rows[0]["dtype"], "steps": len(rows),
                    "gap_mean_abs_max": gap, "gap_max_abs_max": max(r["gap_max_abs"] for r in rows), "drift_median": drift,
                    "sampler_gap_max": logged, "tolerance": tol, "ok": max(gap, logged) <= tol, "sync_visible": drift > 2 * gap})  # fmt: skip
    return out


def summary(info: dict, gen: list[dict], upd: list[dict], checks: list[dict], errors: list[str]) -> str:
    lines = [f"device: {info.get('device_name')} ({info.get('device_mem_gib')} GiB); versions: {info.get('versions')}", ""]
    lines.append("Figure 1(a) generation: model, engine, rollouts per batch -> ms per token (s per batch)")
    for r in gen:
        lines.append(
            f"  {r['model']:<10} {r['engine']:<20} {r['rollouts']:>5} -> {r['per_token_ms']:9.3f} ms/token ({r['seconds']:.2f} s) {r['status']}"
        )
    lines += ["", "Figure 1(b) update: model, finetune, rollouts (micro-batch) -> s per step, peak / added memory MiB"]
    for r in upd:
        ga = f" GA x{r['accum_steps']}" if r["accum_steps"] > 1 else ""
        lines.append(f"  {r['model']:<10} {r['finetune']:<5} {r['batch']:>5} ({r['micro_batch']:>4}){ga:<6} -> {r['seconds']:8.3f} s, "
                     f"{r['mem_peak_mib']:9.1f} / {r['mem_update_mib']:8.1f} MiB {r['status']}")  # fmt: skip
    lines += ["", "loop: sampler/trainer log-prob gap after each sync (max over steps of the per-step mean |diff|)"] if checks else []
    for c in checks:
        lines.append(f"  {c['model']:<10} {c['finetune']:<18} {c['engine']:<5} {c['dtype']:<8} {c['steps']} steps: gap {c['gap_mean_abs_max']:.2e} "
                     f"(max token {c['gap_max_abs_max']:.2e}; logged sampler_gap {c['sampler_gap_max']:.2e}), step drift {c['drift_median']:.2e}, "
                     f"tol {c['tolerance']:.0e}: {'OK' if c['ok'] else 'FAIL'}")  # fmt: skip
    lines += ["", *(f"FAILED: {e}" for e in errors)] if errors else []
    return "\n".join(lines) + "\n"


def main(a) -> int:
    """Every measurement, then the CSVs, the figure and the summary; the random models and the per-measurement results
    live in temporary directories (the models' inside ``--models-dir``, default ``.cache/bench_models``), removed at the end."""
    Path(a.models_dir).mkdir(parents=True, exist_ok=True)
    a.models_dir = tempfile.mkdtemp(prefix="pods-bench-models-", dir=a.models_dir)
    parts = Path(tempfile.mkdtemp(prefix="pods-bench-parts-"))
    try:
        return measure_all(a, parts)
    finally:
        if not a.keep_models:
            shutil.rmtree(a.models_dir, ignore_errors=True)
        shutil.rmtree(parts, ignore_errors=True)


def measure_all(a, parts: Path) -> int:
    out_dir, s, errors = Path(a.out), a.setting, []
    info = run_phase(a, "build", parts / "build.json")
    if "error" in info:
        print(info["error"], file=sys.stderr)
        return 1
    out_dir = out_dir / (a.name or re.sub(r"[^a-z0-9]+", "-", info["device_name"].lower()).strip("-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    if a.step_cost:
        return measure_step_cost(a, parts, info, out_dir)
    gen, upd, loop = [], [], []
    jobs = [("generation", gen, dict(model=m)) for m in s["models"]]
    jobs += [("update", upd, dict(model=m, finetune=ft)) for m in s["models"] for ft in ("full", "lora")]
    big = QWEN3B if a.device == "cuda" else "cpu"
    if not a.no_loop:
        jobs += [("loop", loop, dict(model="tiny"))]
        jobs += [
            ("loop", loop, dict(model=big, finetune=ft))
            for ft in ("lora", "lora4bit")
            if big in s["models"] and (ft == "lora" or a.four_bit)
        ]
    for i, (phase, rows, job) in enumerate(jobs):
        if job["model"] in info["models"]:
            job["model_info"] = info["models"][job["model"]]
        res = run_phase(a, phase, parts / f"{i}.json", **job)
        rows += res.get("rows", [])
        if "error" in res:
            errors.append(f"{phase} {job.get('model')} {job.get('finetune', '')}: {res['error'].splitlines()[-1]}")
    checks = gap_checks(loop)
    errors += [
        f"log-prob gap {c['gap_mean_abs_max']:.2e} > {c['tolerance']:.0e} ({c['model']} {c['finetune']})" for c in checks if not c["ok"]
    ]
    for name, rows in (("generation", gen), ("update", upd), ("loop", loop)):
        write_csv(out_dir / f"{name}.csv", [{"device": info["device_name"], **r} for r in rows])
    weights = "the warm-started tiny model" if s["models"] == ["tiny"] else "random-initialised weights"
    figure1(gen, upd, out_dir / "figure1.png", f"{info['device_name']}: measured with {weights}", info, loop)
    text = summary(info, gen, upd, checks, errors)
    (out_dir / "summary.txt").write_text(text)
    print(text, end="")
    print(f"[bench_gpu] wrote {out_dir}" + (f"; models kept in {a.models_dir}" if a.keep_models else ""))
    return 1 if errors else 0


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--small", action="store_true", help="the smallest sizes (tests)")
    p.add_argument("--engine", choices=["auto", "vllm", "hf"], default="auto",
                   help="auto: vLLM when importable (generation: on CUDA only), else the HF engine")  # fmt: skip
    p.add_argument("--out", default="results/gpu", help="results go to OUT/<gpu name | cpu>/")
    p.add_argument("--name", help="the results directory's name under OUT (default: the device's name)")
    p.add_argument("--models-dir", default=str(MODELS_DIR), help="where the random models' temporary directory goes (3B + 7B: about 21 GB)")
    p.add_argument("--keep-models", action="store_true")
    p.add_argument("--in-process", action="store_true", help="every measurement in this process (faster; CPU tests)")
    p.add_argument("--phase-timeout", type=float, default=3600.0, help="seconds one measurement process may take")
    p.add_argument(
        "--models", type=lambda v: v.split(","), help=f"models measured, comma-separated: {', '.join(LABELS)} (default: the mode's)"
    )
    p.add_argument("--rollouts", type=_int_list, help="generation sweep: rollouts per batch, e.g. 16,32,64 (default: the mode's)")
    p.add_argument(
        "--micro-batches", type=_int_list, help="update sweep: rollouts per micro-batch, e.g. 1,2,4 (default: doubling to the mode's cap)"
    )
    p.add_argument("--no-loop", action="store_true", help="Figure 1 only: no training loop, no log-prob check")
    p.add_argument("--step-cost", action="store_true", help="the loop's three arms per step -> step_summary.csv (benchmarks/step_cost.py)")
    p.add_argument("--repeats", type=int, default=4, help="--step-cost: rounds after the warm-up")
    p.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--finetune", default="full", help=argparse.SUPPRESS)
    p.add_argument("--model-info", type=json.loads, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.device == "auto":
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    a.setting = dict(SETTINGS[a.device + ("-small" if a.small else "")])
    a.setting["micro_batches"] = [2**i for i in range(a.setting["max_micro"].bit_length()) if 2**i <= a.setting["max_micro"]]
    if a.step_cost:  # a random 3B on CUDA, the warm-started tiny model on CPU
        a.setting["models"] = [QWEN3B] if a.device == "cuda" else ["tiny"]
    for key, value in (("models", a.models), ("batches", a.rollouts), ("micro_batches", a.micro_batches)):
        if value:
            a.setting[key] = value
    unknown = [m for m in a.setting["models"] if m not in LABELS]
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)}; known: {', '.join(LABELS)}")
    a.dtype = "bfloat16" if a.device == "cuda" else "float32"
    vllm = _importable("vllm") if a.engine == "auto" else a.engine == "vllm"
    a.gen_engine = "vllm" if vllm and (a.device == "cuda" or a.engine == "vllm") else "hf"
    a.loop_engine = "vllm" if vllm else "hf"
    a.four_bit = a.device == "cuda" and not a.small and _importable("bitsandbytes")
    return a


def _int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]: positive integers, increasing."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"expected increasing positive integers, got {text!r}")
    return values


def _ints(values: list[int]) -> str:
    return ",".join(map(str, values))


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def phase_main(a) -> int:
    """One measurement, in this process: its rows (and errors) go to ``--result`` as JSON."""
    out: dict = {}
    try:
        PHASES[a.phase](a, out)
    finally:
        Path(a.result).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":  # vLLM may spawn processes: keep the guard
    args = parse()
    if args.device == "cuda" and not __import__("torch").cuda.is_available():
        from pods.gpu_env import cuda_report

        sys.exit(f"bench_gpu: --device cuda, but {cuda_report()[1]}")
    sys.exit(phase_main(args) if args.phase else main(args))
