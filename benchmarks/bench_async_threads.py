"""Do two Python threads with one torch intra-op thread each use two cores? (the producer's premise, docs/async.md)

    python benchmarks/bench_async_threads.py [--reps 3] [--out results/cpu/async/threads.txt]

The same CPU work (tanh(A @ x) chains on 256 x 256 float32, as a generate's small matmuls are) done twice in one
thread, then once in the main thread and once in a second thread at the same time, each thread with
``torch.set_num_threads(1)`` (what ``pods.loop.producer`` sets). A ratio (two threads / one thread) near 0.5 means the GIL
is released inside the ops and the two run on two cores; 1.0 means none overlap. Interleaved repeats; the load
average is recorded with each (the ratio is only as clean as the machine is idle).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import _common  # noqa: F401 - the pinned CPU numerics before torch loads
import torch


def work(a: torch.Tensor, n: int = 400) -> None:
    x = a
    for _ in range(n):
        x = torch.tanh(a @ x)


def side(a: torch.Tensor) -> None:
    torch.set_num_threads(1)
    work(a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "cpu" / "async" / "threads.txt"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    lines = []
    for rep in range(args.reps):
        t0 = time.perf_counter()
        work(a), work(a)
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        t = threading.Thread(target=side, args=(a,))
        t.start()
        work(a)
        t.join()
        two = time.perf_counter() - t0
        lines.append(
            f"rep {rep}: one thread {one:.3f} s, two threads {two:.3f} s, ratio {two / one:.2f} (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )
        print(lines[-1], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
