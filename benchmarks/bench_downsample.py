"""Benchmark exact max-variance down-sampling against a bare sort (the floor) and a per-group loop.

Run: ``python benchmarks/bench_downsample.py [threads]`` (CPU, ~15 s). Writes
``results/bench/downsample.csv`` and prints the table. Threads: ``torch.set_num_threads(1)`` by
default, for every implementation (the 2-core machine is shared: 2 threads oversubscribe it and
time noise, not code). The three implementations are timed interleaved, repeat by repeat;
medians (and minima) over 21 repeats (301 for the tiny case). ratio/speedup use medians.

Implementations, on the same float32 ``rewards: [G, n]`` (fixed seed): ``gauss`` = standard
normal (a few float32 ties), ``binary`` = 0/1 (ties everywhere: the tie-rule path).
- ``sort``: ``torch.sort(rewards, dim=1)`` only: the floor of a sort-based exact method.
- ``max_variance``: ``pods.downsample.max_variance`` (for m small next to n it uses two
  ``topk(m + 1)`` instead of a full sort, so it can beat the "floor").
- ``loop``: the naive way: per group a Python loop, sort the row, score the m+1 candidates
  "k highest + (m-k) lowest" with ``torch.var``, keep the best (timed on 256 groups for the big
  shapes and scaled linearly to G; the per-group work is the same for every group).
"""

from __future__ import annotations

import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script without installing the package

from pods.downsample import max_variance  # noqa: E402

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
CASES = [
    (4096, 256, 16, "gauss"),
    (4096, 256, 64, "gauss"),
    (64, 16, 4, "gauss"),
    (4096, 256, 16, "binary"),
    (4096, 256, 64, "binary"),
]  # (G, n, m, rewards)
OUT = ROOT / "results" / "bench" / "downsample.csv"


def loop_max_variance(rewards: torch.Tensor, m: int) -> torch.Tensor:
    """Naive reference: per-group Python loop over the m+1 candidates with torch.var; [G, m]."""
    n = rewards.shape[1]
    out = []
    for row in rewards:
        vals, perm = row.sort()
        cands = [torch.cat([vals[: m - k], vals[n - k :]]) for k in range(m + 1)]
        k = int(torch.stack([c.var(correction=0) for c in cands]).argmax())
        out.append(torch.cat([perm[: m - k], perm[n - k :]]).sort().values)
    return torch.stack(out)


def time_ms(fns: dict, repeats: int) -> dict:
    """(median, min) wall time in ms of each ``fn()`` in ``fns``, interleaved repeat by repeat so
    that load from other processes hits every implementation alike; one warm-up call each."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - t0))
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def make_rewards(kind: str, G: int, n: int) -> torch.Tensor:
    """float32 rewards: ``gauss`` (no ties) or ``binary`` (0/1, ties everywhere: the tie path)."""
    g = torch.Generator().manual_seed(0)
    if kind == "binary":
        return torch.randint(0, 2, (G, n), generator=g).float()
    return torch.randn(G, n, generator=g)


def bench_case(G: int, n: int, m: int, kind: str) -> list[dict]:
    """Time the three implementations on one shape; returns one row per implementation."""
    rewards = make_rewards(kind, G, n)
    tiny = G * n <= 4096
    sub = G if tiny else 256  # the loop runs on a slice of groups; its times are scaled to G
    ms = time_ms(
        {
            "sort": lambda: torch.sort(rewards, dim=1),
            "max_variance": lambda: max_variance(rewards, m),
            "loop": lambda: loop_max_variance(rewards[:sub], m),
        },
        repeats=301 if tiny else 21,
    )
    ms["loop"] = tuple(t * G / sub for t in ms["loop"])
    return [
        dict(
            shape=f"{G}x{n}",
            m=m,
            rewards=kind,
            impl=impl,
            threads=THREADS,
            load1=round(os.getloadavg()[0], 2),
            median_ms=round(med, 4),
            min_ms=round(low, 4),
            ratio_vs_sort=round(med / ms["sort"][0], 3),
            speedup_vs_loop=round(ms["loop"][0] / med, 1),
        )
        for impl, (med, low) in ms.items()
    ]


def check_agreement() -> None:
    """The fast rule and the loop must reach the same variance (sanity before timing)."""
    rewards = torch.randn(64, 256, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for m in (1, 16, 64, 256):
        a, b = max_variance(rewards, m), loop_max_variance(rewards, m)
        va, vb = (rewards.gather(1, i).var(1, correction=0) for i in (a, b))
        assert torch.allclose(va, vb, rtol=1e-12, atol=0), (m, (va - vb).abs().max())


def main() -> None:
    torch.set_num_threads(THREADS)
    check_agreement()
    rows = [row for case in CASES for row in bench_case(*case)]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    header = f"{'shape':>10} {'m':>4} {'rewards':>7} {'impl':>13} {'median_ms':>10} {'min_ms':>9} {'vs_sort':>8} {'vs_loop':>8}"
    print(f"torch {torch.__version__}, threads={THREADS}, load average (1 min) {os.getloadavg()[0]:.2f}\n{header}")
    for r in rows:
        print(
            f"{r['shape']:>10} {r['m']:>4} {r['rewards']:>7} {r['impl']:>13} {r['median_ms']:>10.3f} {r['min_ms']:>9.3f} "
            f"{r['ratio_vs_sort']:>8.2f} {r['speedup_vs_loop']:>8.1f}"
        )
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
