"""The GPU step-cost bench, ``benchmarks/bench_gpu.py --step-cost``: what one training step of each of the loop's three
arms costs on this card, written as ``<out>/<card>/step_summary.csv``, the file the cost model of ``python -m pods.demo
per-step`` reads (``pods.demo.cost_model``: its ``pods_over_grpo16`` at n = 64).

    python benchmarks/bench_gpu.py --step-cost [--device cuda|cpu] [--repeats 4] [--out results/gpu]

The arms, one prompt per step (``pods.loop.rollout_step``: generate, score, select, update, sync), the update in
micro-batches of 16 sequences: GRPO 16/16 (16 rollouts, all trained), PODS 64->16 (64 rollouts, the 16 of max reward
variance trained), GRPO-GA 64 (64 rollouts, all trained in 4 micro-batches of 16). CUDA: a random-weight model of
Qwen2.5-3B-Instruct's architecture (``bench_gpu.build_random_model``, bf16), completions of 256 tokens, the single-GPU
profile (``hardware=l40s_lora``: LoRA r = alpha = 64, gradient checkpointing) with LoRA and with full fine-tuning,
vLLM when it is installed, else the HF engine; random +-1 advantages (a random model earns no reward). CPU (the test
mode): the warm-started tiny model on its toy task, 12 tokens. Each finetune: one warm-up step per arm, then
``--repeats`` rounds, the arms' order rotating each round (load changes hit every arm alike); the same prompt and
sampling seed for every arm within a round. lr = 0: every step starts from the same weights (a step costs the same
at any lr). Peak memory: CUDA ``max_memory_allocated`` per step, or the process's peak RSS on CPU (``mem_kind``).

Rows: ``step_cost.csv`` (every step), ``step_summary.csv`` (one row per finetune, LoRA first: medians per arm of
generate / update / step seconds and peak GiB; the ratios are medians of the per-round ratios).
"""

from __future__ import annotations

import random
import statistics

ARMS = {  # name -> overrides; all three share the loss, so one backend serves them (checked)
    "grpo16": ["algorithm=grpo", "algorithm.n=16"],
    "pods": ["algorithm=grpo_pods", "algorithm.n=64", "algorithm.m=16"],
    "ga": ["algorithm=grpo_ga", "algorithm.n=64", "algorithm.m=16"],
}
TOKENS = {"cuda": 256, "cpu": 12}
MICRO = 16


def arm_config(a, arm: str, finetune: str, compose, model_dir: str):
    """The validated config of ``arm`` with ``finetune`` on this device (see the module docstring)."""
    from pods.config import validate

    t = TOKENS[a.device]
    over = [*ARMS[arm], "train.prompts_per_step=1", f"sampling.max_tokens={t}", f"eval.max_tokens={t}", f"hardware.finetune={finetune}"]
    over += [f"hardware.micro_batch_size={MICRO}", "hardware.lora.r=64", "hardware.lora.alpha=64", "logger=none"]
    if a.device == "cuda":
        over += ["hardware=l40s_lora", "hardware.gpu_memory_gb=null", "model=qwen2_5_3b_instruct", f"model.path={model_dir}"]
        over += [f"rollout={a.loop_engine}", "algorithm.advantage=bench_random_sign", f"optim.name={a.optimizer}"]
    else:
        over += ["hardware=cpu", "rollout=hf"]
    cfg = compose(over)
    if a.device == "cpu":
        cfg["hardware"]["torch_threads"] = __import__("torch").get_num_threads()
    return validate(cfg)


def build(cfg):
    """Backend, engine, the training prompts and golds, the pad id: what ``pods.loop.train`` builds."""
    from pods.backends import BACKENDS
    from pods.engines import ENGINES
    from pods.models import load_tokenizer, resolve_model_dir
    from pods.tasks import DATASETS, encode_prompts

    ds, model_dir = cfg.dataset, resolve_model_dir(cfg.model)
    tok = load_tokenizer(model_dir)
    ids, examples, _ = encode_prompts(DATASETS.get(ds.name)(ds).train, tok, ds.max_prompt_length)
    backend = BACKENDS.get(cfg.hardware.backend)(model_dir, cfg)
    engine = ENGINES.get(cfg.rollout.name)(model_dir, tok, cfg.rollout, policy=backend.policy)
    return backend, engine, ids, [ex.gold for ex in examples], tok.pad_token_id


def one_step(cfg, built, prompt: int, seed: int, mem) -> dict:
    """One ``rollout_step`` of ``cfg``'s arm on one prompt: its phases' seconds, the step's and its peak memory."""
    import torch

    from pods.distributed import SINGLE
    from pods.loop import rollout_step
    from pods.loop.learn import Trainer
    from pods.loop.rollouts import Generation, Source

    backend, engine, ids, golds, pad = built
    backend.alg = cfg.algorithm  # the arms differ in n, m, rule and grad_accum only
    mem.reset()
    torch.manual_seed(seed)
    t0 = mem.now()
    source = Source.of_batch([ids[prompt]], [golds[prompt]], torch.Generator().manual_seed(seed))
    g, t = Generation(cfg, engine, SINGLE, backend.micro_batch_size), Trainer(cfg, backend, pad, SINGLE, engine)
    r = rollout_step(g, t, source, 0.0)
    step = mem.now() - t0
    keys = ("t_generate", "t_update", "t_sync", "tokens", "tokens_trained", "kept")
    return {**{k: r[k] for k in keys}, "step_s": step, "peak_gib": mem.peak() / 1024}


def measure(a, out: dict, compose, memory) -> None:
    """The phase of one finetune (``a.finetune``): warm-up, then ``a.repeats`` rotating rounds; rows into ``out``."""
    cfgs = {arm: arm_config(a, arm, a.finetune, compose, (a.model_info or {}).get("dir", "")) for arm in ARMS}
    strip = ("name", "n", "m", "rule", "grad_accum")
    losses = [{k: v for k, v in c.algorithm.model_dump().items() if k not in strip} for c in cfgs.values()]
    assert all(x == losses[0] for x in losses), "the arms differ beyond n, m, rule and grad_accum: one backend cannot serve them"
    built, mem = build(cfgs["grpo16"]), memory(a.device)
    for arm in ARMS:  # warm-up: first-call kernels and allocations, the optimizer state
        one_step(cfgs[arm], built, 0, 0, mem)
    arms, rows = list(ARMS), out.setdefault("rows", [])
    for rep in range(a.repeats):
        prompt, seed = random.Random(rep).randrange(len(built[2])), 1000 + rep
        for arm in arms[rep % 3 :] + arms[: rep % 3]:
            r = one_step(cfgs[arm], built, prompt, seed, mem)
            rows.append({"finetune": a.finetune, "arm": arm, "repeat": rep, "n": cfgs[arm].algorithm.n, "m": cfgs[arm].algorithm.m,
                         "engine": cfgs[arm].rollout.name, "completion_tokens": TOKENS[a.device], "mem_kind": mem.kind, **r})  # fmt: skip
            print(f"[step_cost] {a.finetune} round {rep + 1}/{a.repeats} {arm}: step {r['step_s']:.3f} s "
                  f"(generate {r['t_generate']:.3f}, update {r['t_update']:.3f}), peak {r['peak_gib']:.2f} GiB", flush=True)  # fmt: skip


def summarise(rows: list[dict], model: str) -> list[dict]:
    """One row per finetune (LoRA first): medians per arm, the per-round ratios' medians (see the module docstring)."""
    med, out = statistics.median, []
    for ft in sorted({r["finetune"] for r in rows}, key=lambda f: f != "lora"):
        by = {(r["arm"], r["repeat"]): r for r in rows if r["finetune"] == ft}
        reps = sorted({k for _, k in by})
        row = {"n": 64, "m": 16, "finetune": ft, "model": model, "engine": by[("pods", reps[0])]["engine"], "prompts": 1,
               "completion_tokens": by[("pods", reps[0])]["completion_tokens"], "repeats": len(reps)}  # fmt: skip
        for arm in ARMS:
            for key, name in (("t_generate", "generate_s"), ("t_update", "update_s"), ("step_s", "step_s"), ("peak_gib", "peak_gib")):
                row[f"{arm}_{name}"] = med(by[(arm, k)][key] for k in reps)
        for a, b in (("pods", "grpo16"), ("ga", "grpo16"), ("pods", "ga")):
            row[f"{a}_over_{b}"] = med(by[(a, k)]["step_s"] / by[(b, k)]["step_s"] for k in reps)
        row["mem_kind"] = by[("pods", reps[0])]["mem_kind"]
        out.append(row)
    return out


def table(summary: list[dict], device: str) -> str:
    lines = [f"Step cost on {device} (one prompt per step; medians over rounds; ratios: medians of per-round ratios):",
             "  finetune  arm      generate s   update s   step s   peak GiB"]  # fmt: skip
    for s in summary:
        for arm in ARMS:
            lines.append(f"  {s['finetune']:<8}  {arm:<7} {s[f'{arm}_generate_s']:10.3f} {s[f'{arm}_update_s']:10.3f} "
                         f"{s[f'{arm}_step_s']:8.3f} {s[f'{arm}_peak_gib']:10.2f}")  # fmt: skip
        lines.append(f"  {s['finetune']:<8}  PODS/GRPO16 {s['pods_over_grpo16']:.2f}x, GA/GRPO16 {s['ga_over_grpo16']:.2f}x, "
                     f"PODS/GA {s['pods_over_ga']:.2f}x")  # fmt: skip
    return "\n".join(lines) + "\n"
