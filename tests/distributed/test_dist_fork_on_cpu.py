"""``Dist.fork``: the producer's process group (docs/async.md, "Several ranks"), on 2 gloo ranks (torchrun, no model).

Under ``train.max_staleness >= 1`` each rank runs two threads that issue collectives: the producer's (all-gathers,
reductions, a gather + broadcast of rows) and the trainer's (reductions). The worker (this file under torchrun) runs
both at once, the producer's on ``dist.fork()`` and the trainer's on the default group, with the two threads
interleaved differently on the two ranks (each rank sleeps on another side). On one group that pairs rank 0's
all-gather with rank 1's all-reduce (an error, wrong values or a hang until the timeout); on two groups every
collective returns what it returns alone. With one process ``fork`` makes no group.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from support.harness import torchrun

ROUNDS = 6


def producer(dist, rank: int) -> list:
    """What a producer's job asks of its group, ROUNDS times; rank 0 dawdles here."""
    out = []
    for i in range(ROUNDS):
        if rank == 0:
            time.sleep(0.02)
        out.append(dist.all_gather(torch.tensor([[rank, i]], dtype=torch.float64)).tolist())
        out.append(dist.reduce([float(rank + i)], "sum"))
        out.append(dist.any(rank == 1 and i % 2 == 0))
        out.append(dist.broadcast(dist.gather_object({"rank": rank, "i": i})))
    return out


def trainer(dist, rank: int) -> list:
    """The trainer's reductions on the default group, meanwhile; rank 1 dawdles here."""
    out = []
    for i in range(2 * ROUNDS):
        if rank == 1:
            time.sleep(0.01)
        out.append(dist.max(float(10 * rank + i)))
    return out


def worker(out: Path) -> None:
    from pods import distributed
    from pods.schema import Hardware

    dist = distributed.init(Hardware(name="gloo2", dist_backend="gloo", dist_timeout_s=60.0))
    own = dist.fork(60.0)
    with ThreadPoolExecutor(1) as pool:
        made = pool.submit(producer, own, dist.rank)
        trained = trainer(dist, dist.rank)
        produced = made.result()
    groups = {"own_backend": torch.distributed.get_backend(own.group), "same": own.group is dist.group, "device": str(own._device)}
    torch.save({"produced": produced, "trained": trained, **groups}, out / f"rank{dist.rank}.pt")
    dist.barrier()


def expected_produced() -> list:
    out = []
    for i in range(ROUNDS):
        out += [[[0.0, float(i)], [1.0, float(i)]], [float(2 * i + 1)], i % 2 == 0, [{"rank": 0, "i": i}, {"rank": 1, "i": i}]]
    return out


@pytest.mark.slow  # 2 processes under torchrun (make test-all)
def test_the_producers_group_runs_beside_the_trainers(tmp_path):
    torchrun([__file__, str(tmp_path)], tmp_path / "worker.log", timeout=180)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert got["own_backend"] == "gloo" and not got["same"] and got["device"] == "cpu"
        assert got["produced"] == expected_produced(), f"rank {rank}: the producer's collectives paired with others"
        assert got["trained"] == [float(10 + i) for i in range(2 * ROUNDS)], f"rank {rank}: the trainer's collectives paired with others"


def test_one_process_forks_no_group():
    from pods.distributed import SINGLE

    own = SINGLE.fork(60.0)
    assert own is not SINGLE and own.group is None and (own.rank, own.world) == (0, 1)
    assert own.all_gather(torch.ones(2, 3)).shape == (2, 3) and own.any(True) and own.broadcast("x") == "x"


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
