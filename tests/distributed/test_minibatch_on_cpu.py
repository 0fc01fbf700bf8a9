"""Mini-batch updates (``algorithm.mini_batch_size``): one mini-batch is today's update bit for bit; of k, the first
optimizer step is a one-step run on its mini-batch; the old log-probs stay those of the start; the LR follows the
schedule by optimizer steps; a step with no token in the loss trains nothing; and 2 DeepSpeed ranks equal one
process (tiny model, real backends; the 2-rank test is slow)."""

from __future__ import annotations

import math

import pytest
import torch

from pods.plan import mini_batch_bounds, plan, step_lr
from pods.schema import check
from support.config import compose
from support.harness import assert_two_ranks_equal_one, fixed_batch, two_ranks_and_one, weights_of, worker_main

LR = 0.5
ARGS = ["algorithm=grpo", "optim.eps=1.0", "optim.max_grad_norm=1.0"]  # eps = 1: a step follows the gradient's scale


def local(tiny_dir, *overrides):
    from pods.backends.local import LocalBackend

    class Recording(LocalBackend):
        """Records the LR and the weights of every optimizer step, and the old log-probs every forward saw."""

        def optimizer_step(self, lr):
            norm = super().optimizer_step(lr)
            self.steps.append((lr, weights_of(self)))
            return norm

        def forward_logprobs(self, mb):
            self.olds.append(None if mb.old_logprobs is None else mb.old_logprobs.clone())
            return super().forward_logprobs(mb)

    b = Recording(str(tiny_dir), check(compose([*ARGS, "hardware.micro_batch_size=3", *overrides])))
    b.steps, b.olds = [], []
    return b


def test_bounds_and_plan():
    assert mini_batch_bounds(10, None) == [(0, 10)] and mini_batch_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert mini_batch_bounds(8, 4, groups=[0, 0, 0, 0, 1, 1, 1, 1]) == [(0, 4), (4, 8)]
    with pytest.raises(ValueError, match="splits a prompt group"):
        mini_batch_bounds(8, 4, groups=[0, 0, 0, 1, 1, 1, 2, 2])
    alg = compose(["algorithm=grpo", "algorithm.n=8", "algorithm.mini_batch_size=16", "algorithm.ppo_epochs=2"])["algorithm"]
    from pods.schema import Algorithm

    p = plan(Algorithm.of(alg), prompts=4, micro_batch_size=64)
    assert (p.rows, p.optimizer_steps, p.micro_batch) == (32, 4, 16)  # 2 mini-batches x 2 passes; micro <= mini


def test_bnpo_mini_batches_must_hold_whole_groups():
    from pods.config import ConfigError, validate

    with pytest.raises(ConfigError, match="algorithm.mini_batch_size"):
        validate(compose(["algorithm=grpo_pods", "algorithm.loss_agg=bnpo", "algorithm.mini_batch_size=6"]))  # m = 16
    validate(compose(["algorithm=grpo_pods", "algorithm.loss_agg=bnpo", "algorithm.mini_batch_size=32"]))


def test_step_lr_follows_the_schedule_by_optimizer_steps():
    """cosine from progress 0.5 to 0.6 (the next rollout step): f = 0.25 is progress 0.525."""
    optim = compose(["optim.schedule=cosine", "optim.lr=2.0"])["optim"]
    from pods.schema import Optim

    lr = step_lr(Optim.of(optim), 0.5, 0.6)
    assert lr(0.0) == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr(0.25) == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi * 0.525)))


def test_one_mini_batch_is_todays_update_bit_for_bit(tiny_dir):
    got = {}
    for size in ("null", "8"):
        b = local(tiny_dir, f"algorithm.mini_batch_size={size}")
        stats = b.update(fixed_batch(3), LR)
        got[size] = (weights_of(b), stats)
    assert all(torch.equal(got["null"][0][k], got["8"][0][k]) for k in got["null"][0])
    assert got["null"][1] == got["8"][1] and got["8"][1]["optimizer_steps"] == 1


def test_k_mini_batches_first_step_old_logprobs_and_lrs(tiny_dir):
    """Mini-batches of 4 of the 8 rows: 2 optimizer steps. The first equals a one-step run on rows 0-3 (with the
    same old log-probs); both steps see the old log-probs of the start, although the policy moved in between; the
    LR of each step is the schedule's at its fraction of the rollout step."""
    batch = fixed_batch(3)
    two = local(tiny_dir, "algorithm.mini_batch_size=4")
    start = two.policy_logprobs(batch)
    stats = two.update(batch, lambda f: LR * (1 - f))
    assert stats["optimizer_steps"] == 2 and [lr for lr, _ in two.steps] == [LR, LR * 0.5]
    one = local(tiny_dir)
    first = batch.rows(0, 4)
    first.old_logprobs = batch.old_logprobs[:4]  # the start's, as the 2-step update fixed them
    one.update(first, LR)
    w_two, w_one = two.steps[0][1], one.steps[0][1]
    assert all(torch.equal(w_two[k], w_one[k]) for k in w_one)  # bit for bit: the same rows, micro-batches, normalisers
    seen = torch.cat([o for o in two.olds])  # micro-batches of 3 within each mini-batch of 4: rows 0-2, 3, 4-6, 7
    assert torch.equal(seen, batch.old_logprobs) and torch.allclose(batch.old_logprobs, start, atol=0, rtol=0)
    moved = (two.policy_logprobs(batch.rows(4, 8)) - start[4:]).abs().max()
    assert moved > 1e-3  # after the first step the policy differs: recomputing the old log-probs would have changed them


def test_a_step_with_no_token_in_the_loss_trains_nothing(tiny_dir):
    """Every sequence rejected (the correction's veto): no optimizer step at all, so AdamW's weight decay and
    momentum do not move the weights either."""
    b = local(tiny_dir, "optim.weight_decay=0.1")
    batch = fixed_batch(3)
    before = weights_of(b)
    batch.loss_mask.zero_()
    stats = b.update(batch, LR)
    assert stats["optimizer_steps"] == 0 and b.steps == [] and stats["loss"] == 0.0
    after = weights_of(b)
    assert all(torch.equal(before[k], after[k]) for k in before)


# ---- 2 DeepSpeed ZeRO-3 ranks, 2 mini-batches each ------------------------------------------------------------
ORDER = [0, 1, 4, 5, 2, 3, 6, 7]  # one process: mini-batch j = the union of both ranks' mini-batch j
LR_DS = 0.01  # small: the 2nd step then sees nearly the same weights in both layouts (at 0.5 grad norms differed by 2e-4)


def minibatch_step(backend, cfg, dist, rows: slice) -> dict:
    """Rank r: rows 4r..4r+3 in mini-batches of 2; one process: the 8 rows reordered, mini-batches of 4, so that
    each optimizer step sees the same rows in both layouts."""
    from pods.backends.base import TrainBatch

    full = fixed_batch(3)
    if dist.world == 1:
        idx = torch.tensor(ORDER)
        batch = TrainBatch(**{k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in vars(full).items()})
    else:
        batch = full.rows(rows.start, rows.stop)
    backend.alg.mini_batch_size = 4 // dist.world
    stats = dist.reduce_metrics(backend.update(batch, lambda f: LR_DS * (1 - f)))
    return {"stats": [stats]}


@pytest.mark.slow  # 2 DeepSpeed ranks under torchrun (make test-all)
def test_two_rank_mini_batches_equal_one_process(tiny_dir, tmp_path):
    pytest.importorskip("deepspeed")
    got, want = two_ranks_and_one(__file__, tmp_path, tiny_dir, minibatch_step, ARGS)
    assert got["stats"][0]["optimizer_steps"] == want["stats"][0]["optimizer_steps"] == 2
    # the same two AdamW steps; float32 reductions in another order (the 1-step tests' bounds)
    assert_two_ranks_equal_one(got, want, weights_tol=2e-6, grad_rel=1e-5)


if __name__ == "__main__":  # torchrun ... tests/distributed/test_minibatch_on_cpu.py OUT_DIR
    worker_main(minibatch_step, ARGS)
