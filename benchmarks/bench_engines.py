"""Benchmark the rollout engines on the tiny model (CPU): vLLM start time, generation throughput of the
HF engine vs vLLM, and the time of one vLLM weight sync (full fine-tuning and LoRA).

Run: ``python benchmarks/bench_engines.py [repeats] [threads]`` (CPU, about 2 min). Threads: 1 by default,
for both engines (the 2-core machine is shared: with 2 OpenMP threads, other processes turned a 9 ms sync
into 30-400 ms, timing noise rather than code). Writes ``results/bench/engines.csv`` and prints it.
Medians (and minima) over ``repeats`` (default 7; syncs: 3 x repeats after one warm-up); the two engines
are interleaved repeat by repeat so that load from other processes hits both alike.

- start: ``VLLMEngine(...)`` construction, in-process (the default); the first one includes
  ``import vllm``, the next ones (after ``close()``) do not. One multi-process start (vLLM's engine-core
  process, ``rollout.multiprocessing=true``) for comparison.
- throughput: completion tokens (stop token included) per second of ``engine.generate`` for G = 4
  toy-task prompts x n rollouts, T = 1, max_tokens = 12 (the CPU configs' settings: the tiny model
  answers in about 6 tokens, so these are short sequences and per-call overhead counts).
- sync: ``engine.load_weights(backend.export_weights())`` after a real optimizer step: full = every
  tensor; lora = the backend computes W + scale * B @ A for every adapted layer, then the same push
  (that computation is inside the timing).
"""

from __future__ import annotations

import csv
import os
import statistics
import sys
import time
from pathlib import Path

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
os.environ["OMP_NUM_THREADS"] = str(THREADS)  # before torch is imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, typed  # noqa: E402  (the repository on sys.path; the config tree composed)

OUT = ROOT / "results" / "bench" / "engines.csv"
ENGINE = ["rollout=vllm", "rollout.kv_cache_gib=0.25"]
ROWS: list[dict] = []


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def row(metric: str, engine: str, setting: str, values: list[float], unit: str) -> None:
    ROWS.append(
        {
            "metric": metric,
            "engine": engine,
            "setting": setting,
            "median": round(statistics.median(values), 4),
            "min": round(min(values), 4),
            "unit": unit,
            "repeats": len(values),
        }
    )


def bench_start(tiny, tok, cfg):
    """In-process starts: the first (with ``import vllm``), then three more after ``close()``; returns the last engine."""
    from pods.engines import ENGINES

    first, eng = timed(lambda: ENGINES.get("vllm")(tiny, tok, cfg.rollout))
    row("start", "vllm", "in-process, first (incl. import vllm)", [first], "s")
    starts = []
    for _ in range(3):
        eng.close()
        t, eng = timed(lambda: ENGINES.get("vllm")(tiny, tok, cfg.rollout))
        starts.append(t)
    row("start", "vllm", "in-process, later", starts, "s")
    return eng


def bench_throughput(tiny, tok, eng, backend, prompts, sampling) -> None:
    """The HF engine (the live policy) vs vLLM with the same weights, interleaved repeat by repeat."""
    from pods.engines.hf import HFEngine

    eng.load_weights(backend.export_weights())
    hf = HFEngine(tiny, tok, {"max_batch": 256}, policy=backend.policy)
    for n in (16, 64):
        rates = {"hf": [], "vllm": []}
        for e in (hf, eng):
            e.generate(prompts, n, sampling)  # warm-up
        for _ in range(REPEATS):
            for name, e in (("hf", hf), ("vllm", eng)):
                t, ro = timed(lambda: e.generate(prompts, n, sampling))  # noqa: B023 - called at once
                rates[name].append(ro.num_tokens / t)
        for name, r in rates.items():
            row("tokens_per_s", name, f"G={len(prompts)} n={n} max_tokens=12", r, "tok/s")


def sync_times(eng, backend) -> list[float]:
    """ms of ``3 x REPEATS`` weight pushes after one warm-up push."""
    times = []
    for _ in range(3 * REPEATS + 1):
        eng.load_weights(backend.export_weights())
        times.append(eng.last_sync_s * 1e3)
    return times[1:]


def bench_sync(tiny, eng, prompts, sampling) -> None:
    """The sync after a real optimizer step, full fine-tuning and LoRA."""
    import torch

    from pods.backends import build_batch
    from pods.backends.local import LocalBackend

    for finetune in ("full", "lora"):
        be = LocalBackend(str(tiny), typed([*ENGINE, f"hardware.finetune={finetune}"]))
        ro = eng.generate(prompts, 4, sampling)
        batch = build_batch([p for p in prompts for _ in range(4)], ro.completion_ids, ro.logprobs, torch.randn(len(ro.completion_ids)), 0)
        be.update(batch, lr=1e-3)
        row("sync", "vllm", f"{finetune}, in-process", sync_times(eng, be), "ms")


def bench_multiprocess(tiny, tok, backend) -> None:
    """vLLM's engine-core process: its start, and the sync over RPC."""
    from pods.engines import ENGINES

    mp = typed([*ENGINE, "rollout.multiprocessing=true"])
    t, eng = timed(lambda: ENGINES.get("vllm")(tiny, tok, mp.rollout))
    row("start", "vllm", "multi-process", [t], "s")
    row("sync", "vllm", "full, multi-process (safetensors over RPC)", sync_times(eng, backend), "ms")
    eng.close()


def main() -> None:
    import torch

    from pods.backends.local import LocalBackend
    from pods.engines import Sampling
    from pods.models import load_tokenizer
    from pods.tasks import DATASETS, encode_prompts
    from pods.tiny import ensure_tiny

    torch.set_num_threads(THREADS)
    tiny = ensure_tiny()
    tok = load_tokenizer(str(tiny))
    prompts = encode_prompts(DATASETS.get("toy_arith")(typed().dataset).test[:4], tok, None)[0]
    cfg, sampling = typed(ENGINE), Sampling(temperature=1.0, max_tokens=12)
    eng = bench_start(tiny, tok, cfg)
    backend = LocalBackend(str(tiny), cfg)
    bench_throughput(tiny, tok, eng, backend, prompts, sampling)
    bench_sync(tiny, eng, prompts, sampling)
    eng.close()
    bench_multiprocess(tiny, tok, backend)
    params = sum(p.numel() for p in backend.policy.parameters())
    for r in ROWS:
        r["model"] = f"tiny ({params / 1e6:.2f}M params, fp32)"
        r["threads"] = THREADS
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        w.writeheader()
        w.writerows(ROWS)
    print(OUT.read_text(), end="")


if __name__ == "__main__":  # vLLM may spawn processes: keep the guard
    main()
