"""PODS' selection on a trainer's flat batch (``pods.integrations.kept``, what ``pods.integrations.trl`` calls): m rows
kept per group of n consecutive rows, the max-variance choice exact against brute force, advantages over the kept
rows with TRL's three ``scale_rewards``, D3S's full-group scope, the batch cut, and one-line refusals. No TRL needed."""

from __future__ import annotations

import itertools

import pytest
import torch

from pods.errors import ConfigError
from pods.integrations import kept


def brute_max_variance(row: list[float], m: int) -> float:
    """The largest population variance of any m of ``row``."""
    return max(torch.tensor(c, dtype=torch.float64).var(unbiased=False).item() for c in itertools.combinations(row, m))


@pytest.mark.parametrize("seed", range(5))
def test_keeps_m_rows_per_group_of_maximal_variance(seed):
    g = torch.Generator().manual_seed(seed)
    G, n, m = 6, 8, 3
    rewards = torch.randint(0, 4, (G * n,), generator=g).float() * 0.25  # graded rewards with ties, like the toy task's
    rows, adv = kept.keep(rewards, n, m, "max_variance")
    assert rows.shape == (G * m,) and adv.shape == (G * m,)
    for grp in range(G):
        mine = rows[grp * m : (grp + 1) * m]
        assert torch.all((mine >= grp * n) & (mine < (grp + 1) * n)), "a group's kept rows are its own"
        assert torch.all(mine[1:] > mine[:-1]), "ascending, no row twice"
        got = rewards[mine].double().var(unbiased=False).item()
        assert got == pytest.approx(brute_max_variance(rewards[grp * n : (grp + 1) * n].tolist(), m), abs=1e-12)


def test_advantages_are_normalised_over_the_kept_rows():
    rewards = torch.tensor([0.0, 1.0, 0.2, 0.8, 1.0, 0.0, 0.0, 0.2])  # G = 2, n = 4
    rows, adv = kept.keep(rewards, 4, 2, "max_reward")
    assert rows.tolist() == [1, 3, 4, 7]
    # kept rewards [1.0, 0.8] and [1.0, 0.2]: mean-centred, over the unbiased std of the two + 1e-4 (TRL's formula)
    s1, s2 = torch.tensor([1.0, 0.8]).std(), torch.tensor([1.0, 0.2]).std()
    assert torch.allclose(adv, torch.tensor([0.1 / (s1 + 1e-4), -0.1 / (s1 + 1e-4), 0.4 / (s2 + 1e-4), -0.4 / (s2 + 1e-4)]))
    _, centred = kept.keep(rewards, 4, 2, "max_reward", scale="none")
    assert torch.allclose(centred, torch.tensor([0.1, -0.1, 0.4, -0.4]))
    _, batch = kept.keep(rewards, 4, 2, "max_reward", scale="batch")
    assert torch.allclose(batch, torch.tensor([0.1, -0.1, 0.4, -0.4]) / (torch.tensor([1.0, 0.8, 1.0, 0.2]).std() + 1e-4))


def test_group_scope_keeps_the_full_groups_advantages():
    """D3S's sample level: the rule reads the full group's advantages, the kept rows keep them (no re-normalising)."""
    rewards = torch.tensor([0.0, 1.0, 0.2, 0.8, 0.5, 0.5])
    group_adv = torch.tensor([-1.2, 1.1, -0.5, 0.6, 0.3, -0.3])  # n = 3: two groups
    rows, adv = kept.keep(rewards, 3, 2, "d3s_intra", scope="group", group_advantages=group_adv)
    assert rows.tolist() == [0, 1, 3, 5]  # per group the pair of largest variance: {-1.2, 1.1} and {0.6, -0.3}
    assert torch.equal(adv, group_adv[rows])


def test_random_rule_is_reproducible_with_a_seeded_generator():
    rewards = torch.arange(32.0)
    a, _ = kept.keep(rewards, 8, 3, "random", generator=torch.Generator().manual_seed(7))
    b, _ = kept.keep(rewards, 8, 3, "random", generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.shape == (12,)


def test_take_cuts_every_per_row_value_and_leaves_the_rest():
    batch = {"ids": torch.arange(12).view(6, 2), "names": list("abcdef"), "total": torch.tensor(5), "other": torch.zeros(3), "none": None}
    out = kept.take(batch, torch.tensor([1, 4]), 6)
    assert out["ids"].tolist() == [[2, 3], [8, 9]] and out["names"] == ["b", "e"]
    assert out["total"] is batch["total"] and out["other"] is batch["other"] and out["none"] is None


@pytest.mark.parametrize(
    "n, m, rule, scope, scale, says",
    [
        (8, 2, "max_varience", "kept", "group", "is not one of"),
        (8, 2, "d3s_cross", "kept", "group", "picks across groups"),
        (8, 0, "max_variance", "kept", "group", "1..n = 8"),
        (8, 9, "max_variance", "kept", "group", "1..n = 8"),
        (8, 4, "all", "kept", "group", "must equal n = 8"),
        (8, 2, "max_variance", "everything", "group", "advantage_scope"),
        (8, 2, "max_variance", "kept", "rank", "scale_rewards"),
    ],
)
def test_bad_settings_are_refused_in_one_line(n, m, rule, scope, scale, says):
    with pytest.raises(ConfigError, match=says) as e:
        kept.check(n, m, rule, scope, scale)
    assert "\n" not in str(e.value)


def test_a_batch_of_partial_groups_is_refused():
    with pytest.raises(ConfigError, match="whole groups"):
        kept.keep(torch.zeros(10), 4, 2, "max_variance")
