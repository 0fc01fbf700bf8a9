"""The knobs of issue 31 on hand-computed values: DAPO's soft overlong penalty, Dr. GRPO's constant normaliser, the group
filter's choice and the refill's bookkeeping, the schema's doors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pods.errors import ConfigError
from pods.loop.rollouts import Groups, varied
from pods.losses import AGGREGATIONS
from pods.schema import check
from pods.tasks.base import Score, overlong_penalty
from support.config import compose


def test_overlong_penalty_is_dapos_soft_punishment():
    # max_tokens 20, buffer 5: free up to 15 tokens, then -1/5 per token, -1 at 20
    assert [overlong_penalty(k, 20, 5) for k in (1, 15, 16, 18, 20)] == [0.0, 0.0, -0.2, pytest.approx(-0.6), -1.0]
    assert overlong_penalty(25, 20, 5, penalty=0.5) == -0.5 and overlong_penalty(10, 20, 5) == 0.0


def test_seq_mean_token_sum_norm_divides_token_sums_by_a_constant():
    per_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    batch = type("B", (), {"__len__": lambda self: 2, "agg_weights": None})()
    AGGREGATIONS.spec("seq_mean_token_sum_norm").prepare(batch, SimpleNamespace(norm_tokens=10))
    loss = AGGREGATIONS.get("seq_mean_token_sum_norm")(per_tok * batch.agg_weights, mask, 2, 4)
    assert loss.item() == pytest.approx((6 + 4) / (2 * 10))  # (sum of token sums) / (sequences x L)
    seq = AGGREGATIONS.get("seq_mean")(per_tok, mask, 2, 4).item()
    assert seq == pytest.approx((2 + 4) / 2)  # seq_mean, for contrast: each sequence's mean first


def scored(rewards: list[list[float]]) -> Groups:
    n = len(rewards[0])
    scores = [Score(terms={"correct": r}, correct=r > 0, formatted=False) for row in rewards for r in row]
    rows = len(rewards) * n
    return Groups(
        n,
        [[g] for g in range(len(rewards))],
        [str(g) for g in range(len(rewards))],
        [[1]] * rows,
        [[0.0]] * rows,
        ["stop"] * rows,
        scores,
        [0] * rows,
        rows,
    )


def test_the_filter_keeps_groups_whose_rewards_vary_and_join_take_keep_rows_together():
    a, b = scored([[1, 1, 1], [0, 1, 0]]), scored([[0, 0, 0], [0.5, 0, 0]])
    assert varied(a) == [1] and varied(b) == [1]
    both = Groups.join([a, b])
    assert varied(both) == [1, 3] and both.rewards.shape == (4, 3) and both.tokens == 12
    picked = both.take([3, 1])
    assert picked.rewards.tolist() == [[0.5, 0, 0], [0, 1, 0]] and picked.prompts == [[1], [1]] and picked.golds == ["1", "1"]


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["train.refill_batches=2"], "train.refill_batches needs train.group_filter"),
        (["train.group_filter=some"], "train.group_filter"),
        (["algorithm.overlong_buffer=12"], "algorithm.overlong_buffer (12) must be < sampling.max_tokens (12)"),
        (["hardware.micro_batch_tokens=0"], "hardware.micro_batch_tokens"),
        (["algorithm.loss_agg=seq_mean_token_sum_normx"], "loss_agg"),
    ],
)
def test_bad_values_are_one_line_errors(overrides, named):
    from pods.config import validate

    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")) as e:
        validate(compose(overrides))
    assert "\n" not in str(e.value)


def test_defaults_are_off():
    cfg = check(compose([]))
    t, a, hw = cfg.train, cfg.algorithm, cfg.hardware
    assert (t.group_filter, t.refill_batches, a.mask_truncated, a.overlong_buffer, a.loss_norm_tokens, hw.micro_batch_tokens) == (
        "none",
        0,
        False,
        None,
        None,
        None,
    )


def test_the_memory_estimate_follows_the_token_budget():
    """``hardware.micro_batch_tokens`` bounds the activations: fewer tokens, a smaller estimate; a budget at least as
    large as the micro-batch's full length changes nothing; below one sequence, one sequence is still estimated."""
    from pods.memory.estimator import estimate

    x8 = ["experiment=gsm8k_qwen3b_pods_h100x8"]
    base = estimate(check(compose(x8)))
    mb, tokens = base.micro_batch, base.tokens
    at = lambda t: estimate(check(compose([*x8, f"hardware.micro_batch_tokens={t}"]))).total_gb  # noqa: E731
    assert mb >= 4 and at(tokens) < at(2 * tokens) < at(4 * tokens) <= base.total_gb
    assert at(mb * tokens) == base.total_gb  # the whole micro-batch fits the budget: nothing changes
    assert at(tokens // 2) == at(tokens)  # below one sequence, one sequence at a time all the same


def test_a_run_recorded_before_these_options_resumes_with_them_off():
    """Its config.json lacks the new keys; the defaults are what it ran with, so nothing differs; a key set otherwise does."""
    import json

    from pods.resume import differences

    cfg = check(compose([]))
    prior = json.loads(json.dumps(cfg.model_dump()))
    for section, key in [
        ("train", "group_filter"),
        ("train", "refill_batches"),
        ("algorithm", "mask_truncated"),
        ("hardware", "micro_batch_tokens"),
    ]:
        del prior[section][key]
    assert differences(cfg, prior, 1, 1) == []
    on = check(compose(["train.group_filter=nonzero_std"]))
    assert differences(on, prior, 1, 1) == ['train.group_filter="<absent>" (now: "nonzero_std")']
