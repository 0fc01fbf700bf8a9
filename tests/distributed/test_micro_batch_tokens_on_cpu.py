"""Token-budget micro-batches (``hardware.micro_batch_tokens``): rows sorted by length, cut by padded tokens, each
micro-batch trimmed to its own longest prompt and completion. The gradient equals today's (micro-batches of rows
padded to the step's longest) up to float32 rounding, for every loss aggregation and with the pre-pass of a token
selector; the pre-pass's log-probs come back in the batch's row order; 2 DeepSpeed ZeRO-3 ranks whose own cuts
differ in number run as many micro-batches and equal one process (tiny model, real backends; the 2-rank test is
slow)."""

from __future__ import annotations

import pytest
import torch

from pods.plan import split_to, token_micro_batches
from pods.schema import check
from support.config import compose
from support.harness import assert_two_ranks_equal_one, fixed_batch, max_gap, two_ranks_and_one, within, worker_main

ARGS = ["algorithm=grpo", "optim.eps=1.0", "optim.max_grad_norm=null", "sampling.temperature=0.9", "algorithm.beta=0.04"]
GRAD_REL = 1e-5  # of the largest gradient entry; float32, the same sums over other shapes and in another order (measured 1e-6)


def recording(tiny_dir, *overrides):
    """A LocalBackend that keeps the accumulated gradient of its first optimizer step and counts its forwards."""
    from pods.backends.local import LocalBackend

    class Recording(LocalBackend):
        def optimizer_step(self, lr):
            self.grads.append({n: p.grad.detach().clone() for n, p in self.policy.named_parameters() if p.grad is not None})
            return super().optimizer_step(lr)

        def forward_stats(self, mb, entropy=False):
            self.widths.append(tuple(mb.input_ids.shape))
            return super().forward_stats(mb, entropy)

    b = Recording(str(tiny_dir), check(compose([*ARGS, "hardware=cpu", *overrides])))
    b.grads, b.widths = [], []
    return b


def test_cuts_sort_by_length_and_keep_the_budget():
    p, c = [3, 8, 4, 3, 5], [10, 2, 30, 1, 9]  # totals 13, 10, 34, 4, 14
    cuts = token_micro_batches(p, c, size=64, budget=40)
    assert cuts == [[2], [4, 0], [1, 3]]  # longest first; [4, 0]: 2 x (5 + 10) = 30 <= 40; adding 1 -> 3 x 15 > 40
    assert token_micro_batches(p, c, size=2, budget=10**6) == [[2, 4], [0, 1], [3]]
    assert token_micro_batches([50], [60], size=4, budget=10) == [[0]]  # a row over the budget goes alone
    cost = lambda rows: len(rows) * (max(p[i] for i in rows) + max(c[i] for i in rows))  # noqa: E731
    assert split_to(cuts, 4, cost) == [[2], [4], [0], [1, 3]] and split_to([[0]], 3, cost) == [[0]]


@pytest.mark.parametrize("agg", ["seq_mean", "token_mean", "bnpo", "seq_mean_token_sum_norm"])
def test_gradient_equals_padded_micro_batches(tiny_dir, agg):
    batch = fixed_batch(5)
    batch.group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    grads = {}
    for budget in ("null", "40"):
        b = recording(tiny_dir, f"algorithm.loss_agg={agg}", "hardware.micro_batch_size=3", f"hardware.micro_batch_tokens={budget}")
        b.update(batch, 0.1)
        grads[budget] = b.grads[0]
        if budget == "40":  # every micro-batch within the budget and trimmed: narrower than the step's width
            assert all(rows * width <= 40 or rows == 1 for rows, width in b.widths)
            assert max(w for _, w in b.widths) < batch.input_ids.shape[1] or len(b.widths) > 3
    gap = max(max_gap(grads["40"][k], grads["null"][k]) for k in grads["null"])
    top = max(g.abs().max().item() for g in grads["null"].values())
    assert top > 1e-3  # a gradient that could differ
    within(gap / top, GRAD_REL, f"gradient, token-budget vs padded micro-batches ({agg}), relative to its largest entry")


def test_the_pre_pass_comes_back_in_row_order(tiny_dir):
    batch = fixed_batch(7)
    padded = recording(tiny_dir, "hardware.micro_batch_size=8").policy_stats(batch, entropy=True)
    cut = recording(tiny_dir, "hardware.micro_batch_tokens=30").policy_stats(batch, entropy=True)
    within(max_gap(cut.logprobs * batch.loss_mask, padded.logprobs * batch.loss_mask), 1e-5, "pre-pass log-probs")
    within(max_gap(cut.entropy * batch.loss_mask, padded.entropy * batch.loss_mask), 1e-5, "pre-pass entropies")


def budget_step(backend, cfg, dist, rows: slice) -> dict:
    """Rank r: rows 4r..4r+3 of the fixed batch (its own cuts: another number of micro-batches than the other rank's)."""
    batch = fixed_batch(3).rows(rows.start, rows.stop)
    p_len, c_len = (t.tolist() for t in batch.lengths())
    counts = [len(token_micro_batches(p_len, c_len, backend.micro_batch_size, 24)), len(backend.micro_batch_rows(batch))]
    stats = dist.reduce_metrics(backend.update(batch, 0.5))
    return {"stats": [stats], "counts": dist.gather_object(counts) if dist.world > 1 else [counts]}


BUDGET = [*ARGS, "algorithm.loss_agg=token_mean", "hardware.micro_batch_tokens=24"]


@pytest.mark.slow  # 2 DeepSpeed ranks under torchrun (make test-all)
def test_two_ranks_run_as_many_micro_batches_and_equal_one_process(tiny_dir, tmp_path):
    pytest.importorskip("deepspeed")
    got, want = two_ranks_and_one(__file__, tmp_path, tiny_dir, budget_step, BUDGET)
    assert [c[0] for c in got["counts"]] == [2, 4]  # each rank's own cuts: 2 and 4 micro-batches
    assert [c[1] for c in got["counts"]] == [4, 4]  # agreed: every rank runs as many forwards (ZeRO-3 lockstep)
    assert_two_ranks_equal_one(got, want, weights_tol=1e-5, grad_rel=1e-4)


if __name__ == "__main__":
    worker_main(budget_step, BUDGET)
