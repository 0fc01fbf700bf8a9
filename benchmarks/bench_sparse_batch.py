"""Benchmark the compressed-KV sampler's batching (``rollout.pad``) on the tiny model (CPU): 32 prompts of
different lengths x 8 samples, decoded in batches of equal prompt length (``pad: false``, the earlier engine) or in
left-padded batches of any length (``pad: true``).

Run: ``python benchmarks/bench_sparse_batch.py [repeats]`` (1 thread; about 1 min idle). Writes
``results/bench/sparse_batch.csv``. The prompts: one toy question padded with 0-31 filler words, so the 32 prompts
have 32 distinct lengths (MATH-style prompts: about 27 distinct lengths in 32); the end-of-turn token is disabled so
every sequence decodes exactly ``length`` tokens; T = 1; StreamingLLM cache (budget 48, interval 8, sink 4), so
every sequence compresses. Arms are interleaved repeat by repeat; medians over ``repeats`` (default 3); ``batches``
is the number of decode loops (each makes one forward per decoded token). The machine's load average is recorded
with each row (the 2-core machine is shared): compare the arms' ratio, not the absolute times.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import _common  # noqa: F401  (the repository on sys.path, pinned numerics)
import torch

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
N, LENGTH = 8, 32
CFG = {"name": "sparse_hf", "method": "sink_window", "budget": 48, "interval": 8, "sink": 4, "max_batch": 256}


def main() -> None:
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from pods.engines import ENGINES, Sampling
    from pods.models import load_tokenizer
    from pods.schema import SparseHfRollout
    from pods.tiny import ensure_tiny

    d = ensure_tiny()
    tok, model = load_tokenizer(d), AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    words = ["please", "think", "about", "this", "sum", "carefully", "and", "then", "answer", "it"]
    msgs = [[{"role": "user", "content": " ".join((words * 4)[:k]) + f" What is {k} + 34?"}] for k in range(32)]
    prompts = [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)) for m in msgs]
    engines = {}
    for pad in (False, True):
        engines[pad] = ENGINES.get("sparse_hf")(d, tok, SparseHfRollout.of({**CFG, "pad": pad}), policy=model)
        engines[pad].stop_ids = set()  # fixed lengths
    times, out = {k: [] for k in engines}, {}
    for _ in range(REPEATS):
        for pad, eng in engines.items():
            t0 = time.perf_counter()
            out[pad] = eng.generate(prompts, N, Sampling(temperature=1.0, max_tokens=LENGTH, seed=0))
            times[pad].append(time.perf_counter() - t0)
    rows = []
    for pad, eng in engines.items():
        med = statistics.median(times[pad])
        rows.append(
            {
                "arm": "padded" if pad else "equal_length",
                "prompts": len(prompts),
                "distinct_lengths": len({len(p) for p in prompts}),
                "samples_per_prompt": N,
                "completion_tokens": LENGTH,
                "batches": len(eng._batches([len(p) for p in prompts for _ in range(N)], pad=pad)),
                "median_s": round(med, 3),
                "tokens_per_s": round(len(prompts) * N * LENGTH / med, 1),
                "speedup_vs_equal_length": round(statistics.median(times[False]) / med, 2),
                "kv_saving": round(out[pad].metrics["kv_saving"], 4),
                "load1": os.getloadavg()[0],
            }
        )
        print(rows[-1], flush=True)
    print(f"wrote {_common.write_csv(rows, _common.ROOT / 'results' / 'bench' / 'sparse_batch.csv')}")


if __name__ == "__main__":
    main()
