"""Several training processes (``torchrun --nproc_per_node N -m pods.train ...``): one rank per GPU.

Each rank takes its own prompts, generates its own rollouts and down-samples its own prompt groups (a group
never spans ranks, so per-group selection is exact); each rank trains on its kept rollouts and the backend
(DeepSpeed) reduces the gradients. What must agree across ranks is agreed here: the training clock and the
stop decision (otherwise ranks deadlock in the next collective), and what is logged is reduced here (only
rank 0 writes files and W&B). With one process ``Dist`` is rank 0 of 1 and every method returns its input.

A ``Dist`` runs its collectives on one process group: the default one (the trainer's: DeepSpeed's gradient reduction,
the clock, the logged rows), or, for the producer thread of ``train.max_staleness >= 1`` (``pods.loop.producer``), a group of
its own made by ``fork``: two threads that issue collectives on one group, in orders that differ between ranks, would
deadlock or pair mismatched collectives.
"""

from __future__ import annotations

import atexit
import os
import socket
from datetime import timedelta

import torch

from pods.log import get
from pods.schema import Hardware

# How a logged per-rank value becomes the step's value: sums of counts, the slowest rank's timings
# (the step waits for it), means for everything else (every rank holds the same number of groups and
# rollouts, so a mean of per-rank means is the global mean).

SUM_KEYS = {"kept", "tokens", "tokens_trained", "timeouts", "n_eval"}
MAX_PREFIX = "t_"


class Dist:
    """Rank, world size and the few collectives the loop needs (gloo on CPU, NCCL on GPU), on ``group`` (None: the
    default process group)."""

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0, group=None):
        self.rank, self.world, self.local_rank, self.group = rank, world, local_rank, group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def _device(self) -> torch.device:  # NCCL reduces CUDA tensors only
        is_nccl = self.world > 1 and torch.distributed.get_backend(self.group) == "nccl"
        return torch.device("cuda", torch.cuda.current_device()) if is_nccl else torch.device("cpu")

    def fork(self, timeout_s: float | None = None) -> Dist:
        """The same ranks on a new gloo process group (``torch.distributed.new_group``), for collectives issued by another
        thread than this Dist's (the producer's, ``pods.loop.producer``). Gloo on every machine: the producer's collectives
        are a few small tensors and pickled rows, which gloo moves on CPU, while a second NCCL communicator used from
        another thread can deadlock against the trainer's (each one's kernels wait on the GPU for their peers, in
        orders that may differ between ranks). Collective: every rank must call it at the same point. One process: an equal Dist,
        no group. ``timeout_s``: a collective waiting longer fails (as ``hardware.dist_timeout_s`` for the default)."""
        if self.world == 1:
            return Dist(self.rank, self.world, self.local_rank)
        timeout = timedelta(seconds=timeout_s) if timeout_s else None
        group = torch.distributed.new_group(backend="gloo", timeout=timeout, group_desc="pods_producer")
        return Dist(self.rank, self.world, self.local_rank, group)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``t`` along dim 0 (same shape on every rank), in rank order."""
        if self.world == 1:
            return t
        parts = [torch.empty_like(t, device=self._device) for _ in range(self.world)]
        torch.distributed.all_gather(parts, t.to(self._device), group=self.group)
        return torch.cat(parts).to(t.device)

    def reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Element-wise sum or max of a list of floats over ranks."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._device)
        reduce_op = torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
        torch.distributed.all_reduce(t, op=reduce_op, group=self.group)
        return t.tolist()

    def max(self, x: float) -> float:
        """The largest ``x`` over ranks (e.g. a step's time: the slowest rank sets the shared clock)."""
        return self.reduce([x], "max")[0]

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any (e.g. a stop signal that reached one rank)."""
        return bool(self.reduce([float(flag)], "max")[0])

    def reduce_metrics(self, row: dict) -> dict:
        """A train row over ranks: counts summed, timings ``t_*`` maxed, the rest averaged."""
        if self.world == 1:
            return row
        keys = sorted(k for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        sums = self.reduce([float(row[k]) for k in keys], "sum")
        maxes = self.reduce([float(row[k]) for k in keys], "max")
        out = dict(row)
        for k, s, mx in zip(keys, sums, maxes):
            out[k] = mx if k.startswith(MAX_PREFIX) else s if k in SUM_KEYS else s / self.world
            if k in SUM_KEYS:
                out[k] = int(round(out[k]))
        return out

    def reduce_eval(self, row: dict) -> dict:
        """An eval row over ranks that each scored a shard: rates weighted by the shards' sizes, counts summed."""
        if self.world == 1:
            return row
        counts = [k for k in sorted(SUM_KEYS) if k in row]
        rates = [k for k in sorted(row) if k not in SUM_KEYS]
        totals = self.reduce([row[k] * row["n_eval"] for k in rates] + [row[k] for k in counts])
        out = {**row, **{k: int(round(v)) for k, v in zip(counts, totals[len(rates) :])}}
        out.update({k: v / max(out["n_eval"], 1) for k, v in zip(rates, totals)})
        return out

    def shard(self, *lists: list, lockstep: bool = False) -> tuple[list, ...]:
        """This rank's share of each of the equally long ``lists`` (every world-th item). ``lockstep``: the
        engine generates with the ZeRO-3-partitioned module, so every rank must run the same number of
        forwards: equal shards (the remainder of ``len / world`` is left out, and said)."""
        if self.world == 1:
            return lists
        total = len(lists[0])
        keep = total - total % self.world if lockstep else total
        if keep < total and self.is_main:
            get(__name__).info(
                f"evaluating {keep} of {total} test prompts: equal shards over {self.world} ranks (lockstep ZeRO-3 generation)"
            )
        return tuple(items[:keep][self.rank :: self.world] for items in lists)

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather_object(self, obj) -> list | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world if self.is_main else None
        torch.distributed.gather_object(obj, out, dst=0, group=self.group)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier(group=self.group)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (a rendezvous port for a local launch)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(hw: Hardware) -> Dist:
    """Join the process group the launcher set up (``WORLD_SIZE``/``RANK``/``LOCAL_RANK``/``MASTER_*``); ``hw``: the
    hardware section.

    A profile with ``dist_backend`` (the DeepSpeed ones) always gets a process group, a single-process one
    when started without a launcher; profiles without it run exactly as before, with no process group.
    """
    from pods.errors import ConfigError

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not hw.dist_backend:
        raise ConfigError(
            f"launched as {world} processes but hardware={hw.name} trains in one: use a multi-process profile (hardware=cpu_ddp2_zero3, ...)"
        )
    if not hw.dist_backend:
        return Dist()
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if hw.device == "cuda":
        torch.cuda.set_device(local_rank)
    if not torch.distributed.is_initialized():
        if world == 1:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        timeout = timedelta(seconds=hw.dist_timeout_s)  # a hung rank fails the run
        torch.distributed.init_process_group(backend=hw.dist_backend, rank=rank, world_size=world, timeout=timeout)
        atexit.register(lambda: torch.distributed.is_initialized() and torch.distributed.destroy_process_group())
    return Dist(rank, world, local_rank)


def close() -> tuple[int, int, int]:
    """The end of a run's collectives: (rank, local rank, world) of the run, every rank past a barrier, and the default
    process group destroyed, so that what runs next in this process (the suite: vLLM) finds none to join (it would
    join a group whose other ranks have exited, and wait for them until the timeout). Without a group: the launcher's
    variables, else rank 0 of 1."""
    env = os.environ
    where = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    if not torch.distributed.is_initialized():
        return where
    where = torch.distributed.get_rank(), where[1], torch.distributed.get_world_size()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return where


SINGLE = Dist()  # one process
