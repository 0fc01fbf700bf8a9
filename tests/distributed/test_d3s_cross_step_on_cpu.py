"""D3S-C over the whole step on 2 gloo ranks (torchrun, no model): the selection is the exact max-Var(A) subset of
BOTH ranks' rollouts, the kept rows move between ranks so that each trains an equal share, and each row arrives
with its own data (prompt, completion, advantage, reward).

The worker (this file under torchrun) runs ``pods.loop.rollouts.select_rows`` and ``Rows.take`` as the loop does, on
each rank's own rewards; rank 1's groups are mostly zero-variance, so most of what it trains comes from rank 0.
The test recomputes the selection in one process on the concatenated rewards and checks it by brute force.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

from support.harness import torchrun

pytestmark = pytest.mark.slow  # 2 processes under torchrun (make test-all)

G, N, M = 2, 4, 2  # groups per rank, rollouts per group, kept per group on average
REWARDS = {  # rank -> [G, N]; rank 1: one all-correct group (A = 0) and one 1-of-4 group
    0: [[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]],
    1: [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]],
}
RULES = ("d3s_cross_step", "d3s_two_stage")


def worker(out: Path) -> None:
    """On each rank: select over both ranks, move the kept rows, save what this rank trains."""
    from pods import distributed
    from pods.loop.rollouts import Rows, select_rows
    from pods.schema import Algorithm, Hardware, complete

    dist = distributed.init(Hardware(name="gloo2", dist_backend="gloo", dist_timeout_s=120.0))
    rewards = torch.tensor(REWARDS[dist.rank], dtype=torch.float64)
    got = {}
    for rule in RULES:
        alg = complete(Algorithm, name="d3s", n=N, m=M, rule=rule, advantage_scope="group", m_intra=3)  # read by a rule that asks
        kept, adv = select_rows(alg, rewards, M, dist=dist)
        every = range(G * N)
        mine = Rows(
            prompt=[[100 * dist.rank + r // N] for r in every],
            completion=[[dist.rank, r] for r in every],  # the row's origin: (rank, row)
            logprobs=[[] for _ in every],
            adv=adv.tolist(),
            reward=rewards.flatten().tolist(),
            group=[dist.rank * G + r // N for r in every],
            truncated=[False for _ in every],
            version=[0 for _ in every],
        )
        rows = mine.take(kept, rule, dist)
        got[rule] = {"kept": kept, "completion": rows.completion, "prompt": rows.prompt, "adv": rows.adv, "reward": rows.reward}
    torch.save(got, out / f"rank{dist.rank}.pt")
    dist.barrier()


def pop_var(x: list[float]) -> float:
    mu = sum(x) / len(x)
    return sum((v - mu) ** 2 for v in x) / len(x)


def test_whole_step_selection_over_two_ranks_is_exact_and_moves_the_rows(tmp_path):
    from pods.advantages import grpo
    from pods.d3s import cross_step, two_stage

    torchrun([__file__, str(tmp_path)], tmp_path / "worker.log", timeout=300)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    every = torch.tensor([REWARDS[0], REWARDS[1]], dtype=torch.float64).view(2 * G, N)
    adv = grpo(every)  # per group, as each rank computes it
    flat = adv.flatten().tolist()
    best = max(pop_var([flat[i] for i in c]) for c in itertools.combinations(range(2 * G * N), 2 * G * M))
    one_stage, two = cross_step(adv, M), two_stage(adv, M, m_intra=3)
    assert pop_var([flat[i] for i in one_stage.tolist()]) == pytest.approx(best, abs=1e-12)  # brute force, 16 choose 8
    assert pop_var([flat[i] for i in two.tolist()]) <= best + 1e-12  # two stages: at most the one-stage optimum
    for rule, chosen in (("d3s_cross_step", one_stage), ("d3s_two_stage", two)):
        assert all(torch.equal(r[rule]["kept"], chosen) for r in ranks)  # every rank computed the same whole-step set
        trained = [i for r in ranks for i in (src * G * N + row for src, row in r[rule]["completion"])]
        assert trained == chosen.tolist()  # rank 0 trains the first half of the step's set, rank 1 the second
        for r in ranks:
            assert len(r[rule]["completion"]) == G * M  # the per-rank count of a per-rank rule: lockstep forwards
            for (src, row), p, a, w in zip(r[rule]["completion"], r[rule]["prompt"], r[rule]["adv"], r[rule]["reward"]):
                assert p == [100 * src + row // N] and a == pytest.approx(flat[src * G * N + row]) and w == REWARDS[src][row // N][row % N]
    moved = [src for src, _ in ranks[1]["d3s_cross_step"]["completion"]]
    assert 0 in moved  # rank 1's zero-variance group gives nothing: rows of rank 0 moved to it


if __name__ == "__main__":  # torchrun --nproc_per_node 2 tests/distributed/test_d3s_cross_step_on_cpu.py OUT_DIR
    worker(Path(sys.argv[1]))
