"""Benchmark what the compressed-KV engine costs in time (``rollout=sparse_hf``) against dense HF ``generate``
(``rollout=hf``) at equal batch and lengths (CPU, 1 thread), on two models: the shipped tiny Qwen2 (2 layers, width
128: per-step overhead dominates) and ``wide``, the same architecture at 4 layers, width 512, 8 query / 2 KV heads,
randomly initialised from the tiny model's config (the matrix work of a step shows).

Run: ``python benchmarks/bench_sparse_engine.py [repeats]`` (about 3 min idle at the default 3 repeats). Writes
``results/bench/sparse_engine.csv``: one row per model, arm and repeat (the machine's 1-minute load average read
right after that repeat: the 2-core machine is shared, compare arms within a repeat), then one ``median`` row per
model and arm with its ratio to ``hf``. Every arm decodes the same 16 prompts of 37 tokens x 1 sample, exactly
``LENGTH`` tokens each (the end-of-turn token disabled), T = 1, one batch. Arms, interleaved repeat by repeat:
- ``hf``: transformers' ``generate`` with its own cache (the GPU bench's HF numbers are this engine);
- ``sparse_hf dense``: pods' hand-written decode loop with a budget above the length (never compresses): the loop's
  own cost against ``generate``;
- ``sparse_hf sink_window`` / ``sparse_hf rkv``: the release's schedule scaled down (``cadence: steps``, 48 kept
  + ``interval`` 16, ``compress_after`` 64, ``shared_set``; R-KV: window 8, kernel 7): what compression adds.
``kv_saving`` / ``kv_saving_token_steps``: the engine's two KV measures for that batch (docs/sparse-rl.md).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import _common  # noqa: F401  (the repository on sys.path, pinned numerics)
import torch

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
PROMPTS, LENGTH = 16, 256
RELEASE = {"budget": 64, "interval": 16, "cadence": "steps", "compress_after": 64, "shared_set": True, "max_batch": 64}
MODELS = {
    "tiny": {},
    "wide": {"num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 2},
}
ARMS = {
    "hf": ("hf", {"max_batch": 64}),
    "sparse_hf dense": ("sparse_hf", {"method": "sink_window", "budget": 4096, "interval": 16, "max_batch": 64}),
    "sparse_hf sink_window": ("sparse_hf", {"method": "sink_window", "sink": 4, **RELEASE}),
    "sparse_hf rkv": ("sparse_hf", {"method": "rkv", "window": 8, "kernel": 7, **RELEASE}),
}


def _engines(d, tok, model) -> dict:
    from pods.engines import ENGINES
    from pods.schema import HfRollout, SparseHfRollout

    out = {}
    for arm, (name, kw) in ARMS.items():
        section = HfRollout if name == "hf" else SparseHfRollout
        out[arm] = ENGINES.get(name)(d, tok, section.of({"name": name, **kw}), policy=model)
        out[arm].stop_ids = set()  # fixed lengths
    return out


def _model(d, changes: dict):
    """The tiny model, or a randomly initialised copy of its architecture with ``changes`` (float32, eval mode)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not changes:
        return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    cfg = AutoConfig.from_pretrained(d)
    for k, v in changes.items():
        setattr(cfg, k, v)
    cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
    cfg.layer_types = [cfg.layer_types[0]] * cfg.num_hidden_layers  # one attention kind per layer, as the tiny model
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _time(arm: str, eng, prompts, rep: int, model: str) -> dict:
    from pods.engines import Sampling

    t0 = time.perf_counter()
    ro = eng.generate(prompts, 1, Sampling(temperature=1.0, max_tokens=LENGTH, seed=rep))
    sec = time.perf_counter() - t0
    assert all(len(c) == LENGTH for c in ro.completion_ids), "every sequence decodes exactly LENGTH tokens"
    m = ro.metrics
    return {
        "model": model,
        "arm": arm,
        "repeat": rep,
        "batch": len(prompts),
        "prompt_tokens": len(prompts[0]),
        "completion_tokens": LENGTH,
        "seconds": round(sec, 3),
        "ms_per_decode_step": round(1000 * sec / LENGTH, 2),
        "ratio_to_hf": "",
        "kv_saving": round(m.get("kv_saving", 0.0), 4),
        "kv_saving_token_steps": round(m.get("kv_saving_token_steps", 0.0), 4),
        "load1": round(os.getloadavg()[0], 2),
    }


def _medians(rows: list[dict], model: str) -> list[dict]:
    mine = [r for r in rows if r["model"] == model]
    med = {a: statistics.median(r["seconds"] for r in mine if r["arm"] == a) for a in ARMS}
    out = []
    for arm in ARMS:
        last = next(r for r in reversed(mine) if r["arm"] == arm)
        loads = [r["load1"] for r in mine if r["arm"] == arm]
        out.append(
            last
            | {"repeat": "median", "seconds": round(med[arm], 3), "ms_per_decode_step": round(1000 * med[arm] / LENGTH, 2)}
            | {"ratio_to_hf": round(med[arm] / med["hf"], 2), "load1": f"{min(loads)}-{max(loads)}"}
        )
    return out


def main() -> None:
    torch.set_num_threads(1)
    from pods.models import load_tokenizer
    from pods.tiny import ensure_tiny

    d = ensure_tiny()
    tok = load_tokenizer(d)
    msgs = [[{"role": "user", "content": f"What is {10 + k} + {34 + k}? Think step by step."}] for k in range(PROMPTS)]
    prompts = [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)) for m in msgs]
    assert len({len(p) for p in prompts}) == 1, "equal prompt lengths: one batch, no padding, in every arm"
    rows, medians = [], []
    for name, changes in MODELS.items():
        engines = _engines(d, tok, _model(d, changes))
        for rep in range(REPEATS):
            for arm, eng in engines.items():
                rows.append(_time(arm, eng, prompts, rep, name))
                print(rows[-1], flush=True)
        medians += _medians(rows, name)
    for r in medians:
        print(r, flush=True)
    print(f"wrote {_common.write_csv(rows + medians, _common.ROOT / 'results' / 'bench' / 'sparse_engine.csv')}")


if __name__ == "__main__":
    main()
