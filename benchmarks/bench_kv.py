"""Benchmark compressed-KV generation (``rollout=sparse_hf``) on the tiny model (CPU): throughput and peak KV
bytes per sequence, full cache vs compressed, against the completion length.

Run: ``python benchmarks/bench_kv.py [repeats]`` (1 thread; about 1 min). Writes ``results/bench/kv.csv``.
Every arm is the same decode loop (the "dense" arm has a budget larger than any sequence, so it never
compresses); the end-of-turn token is disabled so every sequence decodes exactly ``length`` tokens; 8
sequences of one toy prompt at T = 1. Arms are interleaved repeat by repeat; medians over ``repeats``
(default 3). The machine's load average is recorded with each row (the 2-core machine is shared).
"""

from __future__ import annotations

import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ARMS = {
    "dense": {"method": "sink_window", "budget": 100000, "interval": 1},
    "sink_window_b32": {"method": "sink_window", "budget": 32, "interval": 8, "sink": 4},
    "snapkv_b32": {"method": "snapkv", "budget": 32, "interval": 8, "window": 4},
    "rkv_b64": {"method": "rkv", "budget": 64, "interval": 16, "window": 8},
}
LENGTHS = [32, 64, 128, 200]


def main() -> None:
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from pods.engines import ENGINES, Sampling
    from pods.models import load_tokenizer
    from pods.tiny import ensure_tiny

    d = ensure_tiny()
    tok, model = load_tokenizer(d), AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    prompt = list(
        tok.apply_chat_template(
            [{"role": "user", "content": "What is 12 + 34? Answer in format: 'Answer: {result}'"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    engines = {}
    for name, c in ARMS.items():
        engines[name] = ENGINES.get("sparse_hf")(d, tok, c, policy=model)
        engines[name].stop_ids = set()  # fixed lengths
    rows = []
    for length in LENGTHS:
        times, mem = {k: [] for k in ARMS}, {}
        for _ in range(REPEATS):
            for name, eng in engines.items():
                t0 = time.perf_counter()
                ro = eng.generate([prompt], 8, Sampling(temperature=1.0, max_tokens=length, seed=0))
                times[name].append(time.perf_counter() - t0)
                mem[name] = ro.metrics
        for name in ARMS:
            med = statistics.median(times[name])
            rows.append(
                {
                    "arm": name,
                    "prompt_tokens": len(prompt),
                    "completion_tokens": length,
                    "tokens_per_s": round(8 * length / med, 1),
                    "median_s": round(med, 4),
                    "kv_bytes_dense": int(mem[name]["kv_bytes_dense"]),
                    "kv_bytes_sparse": int(mem[name]["kv_bytes_sparse"]),
                    "kv_saving": round(mem[name]["kv_saving"], 4),
                    "load1": os.getloadavg()[0],
                }
            )
            print(rows[-1], flush=True)
    out = Path(__file__).resolve().parents[1] / "results" / "bench" / "kv.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
