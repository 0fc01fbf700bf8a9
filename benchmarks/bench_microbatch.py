"""Token-budget micro-batches (``hardware.micro_batch_tokens``) against today's padding (pre-registered in docs/knobs.md).

``python benchmarks/bench_microbatch.py [--repeats 5]`` (1 thread; about a minute per repeat on the tiny model).
One step of 64 rows with prompts of 16-32 tokens and long-tailed completions (log-normal, capped at 224 tokens, mean
about 0.44 of the cap, like D3S' 900 of 2,048), on ``LocalBackend`` (the tiny model, float32): the no-grad pre-pass
with entropies (what D3S' token selection runs) and one optimizer step. Arms, interleaved within every repeat:

- ``padded``: today, micro-batches of 8 rows padded to the step's longest prompt and completion;
- ``sorted_8``: ``micro_batch_tokens`` = 8 x 256 (the padded arm's tokens per micro-batch at full length), at most 8
  rows: sorting and trimming only;
- ``packed``: the same budget, up to 64 rows per micro-batch.

Columns: ``padded_tokens`` (sum over the update's micro-batches of rows x width: the tokens the forwards compute),
``micro_batches``, ``step_s`` (median pre-pass + update seconds), ``time_ratio`` (median over repeats of the arm's time
/ ``padded``'s in the same repeat), ``saved_act_mb`` (the most bytes autograd saved for backward in one micro-batch:
the activation peak micro-batching bounds), ``load_1m``. Writes ``results/bench/microbatch.csv``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import _common  # noqa: F401 - the repository on sys.path, the CPU numerics pinned before torch loads
import torch
from _common import ROOT, typed

OUT = ROOT / "results" / "bench" / "microbatch.csv"
ROWS, CAP, BUDGET = 64, 224, 8 * 256
ARMS = {
    "padded": ["hardware.micro_batch_size=8"],
    "sorted_8": ["hardware.micro_batch_size=8", f"hardware.micro_batch_tokens={BUDGET}"],
    "packed": ["hardware.micro_batch_size=64", f"hardware.micro_batch_tokens={BUDGET}"],
}
BASE = ["hardware=cpu", "hardware.torch_threads=1", "algorithm=grpo", "optim.max_grad_norm=null"]


def step_batch(seed: int = 0):
    """64 rows: prompts U[16, 32], completions log-normal (median 80, sigma 0.6) capped at 224 tokens."""
    from pods.backends import build_batch

    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(16, 33, (ROWS,), generator=g)
    c_len = (torch.randn(ROWS, generator=g) * 0.6 + torch.log(torch.tensor(80.0))).exp().round().clamp(4, CAP).long()
    prompts = [torch.randint(10, 280, (int(k),), generator=g).tolist() for k in p_len]
    completions = [torch.randint(10, 280, (int(k),), generator=g).tolist() for k in c_len]
    return build_batch(prompts, completions, [[0.0] * len(c) for c in completions], torch.randn(ROWS, generator=g), 0)


def measure(backend, batch) -> tuple[float, int, int, float]:
    """(seconds, padded tokens of the update's micro-batches, their number, most MB saved for backward in one)."""
    widths, saved = [], {"now": 0, "max": 0}
    real_fwd, real_bwd = backend.forward_stats, backend.backward

    def forward_stats(mb, entropy=False):
        if torch.is_grad_enabled():
            widths.append(mb.input_ids.numel())
        return real_fwd(mb, entropy)

    def pack(t):
        saved["now"] += t.numel() * t.element_size()
        saved["max"] = max(saved["max"], saved["now"])
        return t

    def backward(loss):
        real_bwd(loss)
        saved["now"] = 0

    backend.forward_stats, backend.backward = forward_stats, backward
    try:
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            batch.old_logprobs = None
            backend.policy_stats(batch, entropy=True)  # the pre-pass (D3S' entropies)
            backend.update(batch, 1e-6)
        return time.perf_counter() - t0, sum(widths), len(widths), saved["max"] / 2**20
    finally:
        backend.forward_stats, backend.backward = real_fwd, real_bwd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from pods.backends.local import LocalBackend
    from pods.tiny import ensure_tiny

    backends = {name: LocalBackend(str(ensure_tiny()), typed([*BASE, *ov])) for name, ov in ARMS.items()}
    batch = step_batch()
    loads, got = [], {name: [] for name in ARMS}
    for r in range(args.repeats):
        loads.append(os.getloadavg()[0])
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))  # interleaved, alternating order
        for name in order:
            got[name].append(measure(backends[name], batch))
        print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f}s" for k, v in got.items()), flush=True)
    rows = []
    for name, runs in got.items():
        ratios = [run[0] / base[0] for run, base in zip(runs, got["padded"])]
        _, tokens, count, saved = runs[0]
        rows.append(
            {
                "arm": name,
                "rows": ROWS,
                "mean_completion": round(float(step_batch().loss_mask.sum(1).mean()), 1),
                "padded_tokens": tokens,
                "tokens_ratio": round(tokens / got["padded"][0][1], 4),
                "micro_batches": count,
                "step_s": round(statistics.median(run[0] for run in runs), 3),
                "time_ratio": round(statistics.median(ratios), 4),
                "saved_act_mb": round(saved, 2),
                "repeats": args.repeats,
                "load_1m": round(statistics.mean(loads), 2),
            }
        )
    _common.write_csv(rows, OUT)
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
