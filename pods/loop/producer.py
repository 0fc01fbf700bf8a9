"""The producer of ``train.max_staleness: k >= 1``: one background thread that runs steps (1)-(5) (``prepare``) ahead
of the trainer while it updates (docs/async.md). The synchronous loop (``max_staleness: 0``, the default) starts none.

Batch b (the batch of update b, counted from 1) is generated with policy version max(0, b - 1 - k) exactly, whatever
the threads' speeds: the trainer submits the jobs, and pushes version u into the producer's engine only once the
producer is idle, after update u. So the row staleness (the trainer's version before update b, b - 1, minus the row's
version) is at most k, every run of a config computes the same numbers, and the producer owns, while a job runs, its
``Source`` (the prompt sampler, the selection generator) and the global torch/NumPy RNGs the engine samples from; the
trainer draws from no RNG (a LoRA dropout would: refused by ``pods.config``) and evaluates with the RNGs forked.

A checkpoint drains the producer (``rewind``): the batches generated ahead are dropped, and the source goes back to
where the oldest of them started, so the next batch is generated from the saved weights, in an uninterrupted run and
in a run resumed from that checkpoint alike.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from pods.distributed import Dist
from pods.loop.rollouts import Generation, Ready, Source, prepare


def _start_thread(threads: int, device: int | None) -> None:
    """The producer thread's torch settings: the trainer's intra-op threads and, on GPUs, the rank's device (a new
    thread starts on cuda:0: every rank's producer would launch its kernels in device 0's context)."""
    torch.set_num_threads(threads)
    if device is not None:
        torch.cuda.set_device(device)


class Producer:
    """One background thread that runs ``prepare`` for the next batches, in order (module docstring).

    ``gen``: the producer's engine (its own copy of the policy when the trainer's engine samples with the live module:
    ``pods.engines.frozen.Frozen``) and its ranks (``Dist.fork``: its collectives on a group of their own, beside the
    trainer's); ``source``: the prompts and random state it draws from; ``weights()``: the trainer's weights to push;
    ``trainer``: the trainer's ranks (a barrier before each push). The trainer calls, per step u (its version before
    the update: u - 1): ``top_up`` (submit batches up to u + k), ``take(u)`` (wait for batch u), then after the update
    ``settle(u)`` (wait until the producer is idle, push version u); and ``rewind`` before a checkpoint.

    Several ranks: each runs its own producer; each runs the same jobs in the same order, so the collectives of
    ``prepare`` (the refill's agreement, a whole-step rule's gather, the reward statistics) pair up across ranks."""

    def __init__(self, gen: Generation, source: Source, weights: Callable, trainer: Dist, version: int, next_batch: int):
        cfg = gen.cfg
        self.gen, self.source, self.weights, self.trainer = gen, source, weights, trainer
        self.k, self.last = cfg.train.max_staleness, cfg.train.max_steps
        gen.dist.barrier()  # every rank's start push is done (vllm_server: the other ranks saw its label) ...
        gen.engine.version, self.next = version, next_batch  # ... before rank 0 relabels the servers with ``version``
        gen.dist.barrier()  # ... and that is done before any rank's producer generates
        self.pending: deque[tuple[int, Future]] = deque()
        threads = cfg.hardware.torch_threads or torch.get_num_threads()
        device = torch.cuda.current_device() if cfg.hardware.device == "cuda" else None  # this rank's (pods.distributed)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="pods-producer", initializer=_start_thread, initargs=(threads, device))

    @property
    def version(self) -> int:
        return self.gen.engine.version

    def top_up(self, step: int, progress_at: Callable[[int], float]) -> None:
        """Submit the batches up to ``step + 1 + k`` (none past ``train.max_steps``); ``step``: the trainer's steps
        done; ``progress_at(b)``: the training progress the plan of batch b reads."""
        while self.next <= step + 1 + self.k and not (self.last and self.next > self.last):
            assert self.version >= self.next - 1 - self.k, (self.version, self.next)  # the admission bound, by construction
            self.pending.append((self.next, self.pool.submit(self._job, progress_at(self.next))))
            self.next += 1

    def _job(self, progress: float) -> tuple[Ready, dict]:
        start = self.source.state()  # where this batch starts: what a rewind restores
        return prepare(self.gen, self.source, progress), start

    def take(self, batch: int) -> Ready:
        """Batch ``batch``, once generated (an error in the producer is raised here)."""
        index, future = self.pending.popleft()
        assert index == batch, (index, batch)
        return future.result()[0]

    def settle(self, version: int) -> float:
        """Wait until every submitted batch is generated, then serve policy ``version``; returns the seconds waited."""
        t0 = time.perf_counter()
        for _, future in self.pending:
            future.result()
        self.trainer.barrier()  # every rank's producer is idle before rank 0 pushes into servers they all share
        waited = time.perf_counter() - t0
        self.gen.engine.load_weights(self.weights())
        self.gen.engine.version = version
        return waited

    def rewind(self) -> int:
        """Drop the batches generated ahead (the producer is idle: after ``settle``) and restore the source where the
        oldest of them started; returns the next batch to generate (a checkpoint's ``next_batch``): the trainer's next
        step's, from the current weights."""
        if self.pending:
            index, future = self.pending[0]
            start = future.result()[1]
            self.pending.clear()
            self.source.restore(start)
            self.next = index
        return self.next

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
