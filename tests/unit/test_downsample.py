"""Down-sampling rules: exactness against brute force, tie rules, shapes, randomness, errors.

Variances are compared (not indices), since ties allow several optimal subsets; brute force runs
in float64 over every m-subset (itertools.combinations) for n <= 12.
"""

import itertools
import math

import pytest
import torch

import pods.downsample as ds
from pods.downsample import RULES, all, max_reward, max_variance, random, select

RULE_NAMES = ["all", "max_reward", "max_variance", "random"]


def pop_var(x: torch.Tensor) -> torch.Tensor:
    """Population variance over the last dim in float64, shifted by the first element first."""
    x = x.to(torch.float64)
    return (x - x[..., :1]).var(dim=-1, correction=0)


def brute_max_var(rewards: torch.Tensor, m: int) -> torch.Tensor:
    """``[G, n]`` -> ``[G]``: the largest population variance over all m-subsets of each row."""
    combos = torch.tensor(list(itertools.combinations(range(rewards.shape[1]), m)))  # [C, m]
    return pop_var(rewards.to(torch.float64)[:, combos]).amax(dim=1)  # [G, C, m] -> [G]


def kept_var(rewards: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    return pop_var(rewards.to(torch.float64).gather(1, kept))


def assert_valid(kept: torch.Tensor, rewards: torch.Tensor, m: int) -> None:
    """Shape [G, m], long, same device, distinct in-range columns sorted ascending per row."""
    G, n = rewards.shape
    assert kept.shape == (G, m) and kept.dtype == torch.long and kept.device == rewards.device
    if G and m > 1:
        assert bool((kept[:, 1:] > kept[:, :-1]).all()), "not strictly ascending per row"
    if G:
        assert int(kept.min()) >= 0 and int(kept.max()) < n


def make_rewards(kind: str, G: int, n: int, g: torch.Generator) -> torch.Tensor:
    """Reward rows of several kinds, float64."""
    f64 = dict(generator=g, dtype=torch.float64)
    if kind == "gauss":
        return torch.randn(G, n, **f64) * 3 - 1
    if kind == "integer":
        return torch.randint(-3, 4, (G, n), generator=g).double()
    if kind == "binary":
        return torch.randint(0, 2, (G, n), generator=g).double()
    if kind == "ties":  # heavy ties: three values, one dominant
        return torch.tensor([0.0, 0.0, 0.0, 0.1, 1.2], dtype=torch.float64)[torch.randint(0, 5, (G, n), generator=g)]
    if kind == "offset":  # 1e6 + 1e-3 * integer: the differences must survive
        return 1e6 + 1e-3 * torch.randint(0, 6, (G, n), generator=g).double()
    if kind == "scales":  # rows of wildly different scale and sign, some constant
        r = torch.randn(G, n, **f64) * 10.0 ** torch.randint(-6, 7, (G, 1), generator=g)
        r[::3] = r[::3, :1]
        return r
    raise ValueError(kind)


KINDS = ["gauss", "integer", "binary", "ties", "offset", "scales"]


# ---- max_variance: exactness -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_max_variance_matches_brute_force(kind):
    g = torch.Generator().manual_seed(KINDS.index(kind))
    for _ in range(4):
        for n in range(1, 13):
            for m in range(1, n + 1):
                r = make_rewards(kind, 6, n, g)
                kept = max_variance(r, m)
                assert_valid(kept, r, m)
                best, got = brute_max_var(r, m), kept_var(r, kept)
                torch.testing.assert_close(got, best, rtol=1e-9, atol=1e-300, msg=f"{kind} n={n} m={m}")


def test_offset_rewards_pick_the_same_optimum_as_their_integers():
    """1e6 + 1e-3 * k must select a subset whose k have the maximal variance (exact, in k)."""
    g = torch.Generator().manual_seed(7)
    for n, m in [(8, 3), (12, 5), (12, 6), (10, 1), (9, 9)]:
        k = torch.randint(0, 1000, (32, n), generator=g).double()
        kept = max_variance(1e6 + 1e-3 * k, m)
        torch.testing.assert_close(kept_var(k, kept), brute_max_var(k, m), rtol=1e-12, atol=0.0)


def test_float32_input_matches_brute_force():
    g = torch.Generator().manual_seed(3)
    for n, m in [(12, 4), (11, 7), (6, 2)]:
        r = torch.randn(64, n, generator=g)
        torch.testing.assert_close(kept_var(r, max_variance(r, m)), brute_max_var(r, m), rtol=1e-9, atol=0.0)


@pytest.mark.parametrize("kind", ["gauss", "integer", "binary", "ties", "offset"])
def test_large_n_matches_candidate_enumeration(kind):
    """n up to a few thousand: the kept variance is the best of the m+1 lemma candidates,
    evaluated one by one with torch.var (the naive reference), on both internal paths."""
    g = torch.Generator().manual_seed(11)
    for n, m in [(3000, 16), (2048, 1000), (500, 499), (300, 64), (64, 16)]:
        r = make_rewards(kind, 3, n, g)
        v = r.sort(dim=1).values
        cands = torch.stack([pop_var(torch.cat([v[:, : m - k], v[:, n - k :]], 1)) for k in range(m + 1)], 1)
        torch.testing.assert_close(kept_var(r, max_variance(r, m)), cands.amax(1), rtol=1e-9, atol=1e-300)


def test_binary_rewards_split_evenly():
    """Theorem: binary rewards with both values plentiful keep m/2 of each (odd m: floor/ceil);
    the documented tie rule keeps ceil(m/2) of the higher value."""
    g = torch.Generator().manual_seed(5)
    for n in (16, 40, 64, 256):
        r = torch.zeros(20, n)
        for row in range(20):  # at least n // 4 of each value
            ones = int(torch.randint(n // 4, n - n // 4 + 1, (1,), generator=g))
            r[row, torch.randperm(n, generator=g)[:ones]] = 1.0
        for m in range(1, n // 4 + 1):
            highs = r.gather(1, max_variance(r, m)).sum(1)
            assert bool((highs == math.ceil(m / 2)).all()), (n, m, highs)
            highs_01 = (r * 0.2 + 0.1).gather(1, max_variance(r * 0.2 + 0.1, m)).sum(1)  # 0.1 / 0.3
            assert torch.allclose(highs_01, torch.tensor(0.1 * m + 0.2 * math.ceil(m / 2))), (n, m)


# ---- max_variance: documented tie rules and internal paths ---------------------------------------


def test_tie_rules():
    assert max_variance(torch.full((2, 5), 3.0), 2).tolist() == [[3, 4], [3, 4]]  # constant: last m
    r = torch.tensor([[1.0, 5.0, 2.0, 5.0, 0.0]])
    assert max_variance(r, 1).tolist() == [[3]]  # m = 1: last column holding the maximum
    assert max_variance(r, 5).tolist() == [[0, 1, 2, 3, 4]]
    # equal values: the low part takes the smallest columns, the high part the largest
    assert max_variance(torch.tensor([[2.0, 0.0, 9.0, 0.0, 0.0]]), 2).tolist() == [[1, 2]]
    assert max_variance(torch.tensor([[9.0, 0.0, 9.0, 3.0, 9.0]]), 2).tolist() == [[1, 4]]
    # k = 1, 2, 3 tie ({0,0,5} ~ {0,5,5}); the largest k = 3 is the top 3 of the stable order
    assert max_variance(torch.tensor([[0.0, 5.0, 0.0, 5.0, 0.0]]), 3).tolist() == [[1, 3, 4]]
    assert max_variance(torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0, 1.0]]), 3).tolist() == [[0, 3, 5]]  # ceil(3/2) ones


def test_topk_path_equals_sort_path(monkeypatch):
    """The topk path returns exactly the stable-sort path's indices, through its fast gather
    (no boundary ties) and through the threshold tie rule (ties), on float32 and float64."""
    calls = []
    real = ds._keep_by_threshold
    monkeypatch.setattr(ds, "_keep_by_threshold", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(2)
    tie_trials = 0
    for trial in range(72):
        n = int(torch.randint(2, 300, (1,), generator=g))
        m = int(torch.randint(1, n, (1,), generator=g))
        r = make_rewards(KINDS[trial % len(KINDS)], 16, n, g).to(torch.float32 if trial % 2 else torch.float64)
        ref = ds._max_variance_sorted(r, m)
        before = len(calls)
        assert torch.equal(ds._max_variance_topk(r, m), ref), (trial, n, m)
        tie_trials += len(calls) > before
        assert torch.equal(max_variance(r, m), ref)
    assert 0 < tie_trials < 72  # both branches exercised
    r = torch.tensor([[0.0, 1.0] * 20, [3.0] * 40, list(range(40))])  # ties, constant, distinct
    for m in (1, 2, 5, 13, 39):
        assert torch.equal(ds._max_variance_topk(r, m), ds._max_variance_sorted(r, m))


def test_input_not_modified_and_deterministic():
    r = torch.randn(8, 100, dtype=torch.float64)
    before = r.clone()
    a, b = max_variance(r, 10), max_variance(r, 10)
    assert torch.equal(a, b) and torch.equal(r, before)
    assert torch.equal(max_variance(r[:, :20], 5), max_variance(r[:, :20].clone(), 5))


# ---- all rules: shapes, dtypes, devices ----------------------------------------------------------


def _refuses_m_below_n(name: str) -> bool:
    """Whether the rule keeps every rollout: it refuses to keep 2 of 3, naming m == n."""
    try:
        select(name, torch.zeros(1, 3), 2)
    except ValueError as e:
        assert "m == n" in str(e), e
        return True
    return False


CONTRACT_SHAPES = [(5, 16, 4), (3, 64, 16), (2, 7, 7), (4, 300, 100), (0, 8, 3), (0, 300, 10), (1, 1, 1)]  # (G, n, m)


@pytest.mark.parametrize("name", RULE_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_output_contract(name, dtype):
    """Every rule on every shape it accepts: a rule that refuses m < n (``all`` keeps every rollout) is held to m = n."""
    g = torch.Generator().manual_seed(0)
    keeps_all = _refuses_m_below_n(name)
    for G, n, m in CONTRACT_SHAPES:
        m = n if keeps_all else m
        r = (torch.randn(G, n, generator=g) * 2).to(dtype)
        kept = select(name, r, m, generator=torch.Generator().manual_seed(1))
        assert_valid(kept, r, m)


def test_max_reward_keeps_the_largest_with_smallest_index_on_ties():
    g = torch.Generator().manual_seed(4)
    for n, m in [(10, 3), (12, 12), (64, 20)]:
        r = torch.randint(0, 4, (30, n), generator=g).float()
        kept = max_reward(r, m)
        assert_valid(kept, r, m)
        torch.testing.assert_close(r.gather(1, kept).sort(1).values, r.topk(m, dim=1).values.flip(1))
    assert max_reward(torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]]), 2).tolist() == [[1, 2]]


def test_all_is_identity():
    r = torch.randn(3, 6)
    assert all(r, 6).tolist() == [list(range(6))] * 3
    with pytest.raises(ValueError, match="m == n"):
        all(r, 4)


# ---- random ----------------------------------------------------------------------------------------


def test_random_is_reproducible_under_a_seed():
    r = torch.randn(50, 32)
    a = random(r, 8, generator=torch.Generator().manual_seed(123))
    b = select("random", r, 8, generator=torch.Generator().manual_seed(123))
    c = random(r, 8, generator=torch.Generator().manual_seed(124))
    assert torch.equal(a, b) and not torch.equal(a, c)
    gen = torch.Generator().manual_seed(9)
    assert not torch.equal(random(r, 8, generator=gen), random(r, 8, generator=gen))  # advances
    assert_valid(random(r, 8), r, 8)  # global RNG


def test_random_is_uniform_and_rows_are_independent():
    n, m, G = 6, 2, 60000
    kept = random(torch.zeros(G, n), m, generator=torch.Generator().manual_seed(0))
    subset_id = kept[:, 0] * n + kept[:, 1]  # 15 possible subsets
    freq = torch.bincount(subset_id, minlength=n * n)[torch.triu_indices(n, n, 1).T @ torch.tensor([n, 1])]
    assert freq.shape == (15,) and int(freq.sum()) == G
    expected = G / 15
    assert float(((freq - expected) ** 2 / expected).sum()) < 50  # chi2(14): p ~ 1e-5
    # consecutive rows: joint distribution of (row 2i, row 2i+1) subsets is the product
    pairs = subset_id[0::2] * (n * n) + subset_id[1::2]
    same = float((subset_id[0::2] == subset_id[1::2]).double().mean())
    assert abs(same - 1 / 15) < 0.01
    assert torch.unique(pairs).numel() == 225  # every pair of subsets occurs


# ---- errors and registry -----------------------------------------------------------------------


@pytest.mark.parametrize("name", RULE_NAMES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rewards_name_the_group(name, bad):
    r = torch.randn(5, 4)
    r[3, 1] = bad
    with pytest.raises(ValueError, match=r"group\(s\) \(row index\) 3\b"):
        select(name, r, 4)


def test_large_finite_rewards_are_not_flagged():
    r = torch.full((2, 4), 3e38)  # row sums overflow float32, values are finite
    assert_valid(max_variance(r, 2), r, 2)


@pytest.mark.parametrize("name", RULE_NAMES)
def test_bad_m_and_shape(name):
    r = torch.randn(2, 5)
    for m in (0, -1, 6):
        with pytest.raises(ValueError, match="1 <= m <= n"):
            select(name, r, m)
    for shape in [(5,), (2, 3, 5), ()]:
        with pytest.raises(ValueError, match="2-D"):
            select(name, torch.zeros(shape), 1)


def test_registry():
    d3s_rules = ["d3s_cross", "d3s_cross_step", "d3s_intra", "d3s_two_stage"]  # D3S's rules live in pods.d3s
    assert RULES.names() == sorted(RULE_NAMES + d3s_rules)
    for name in RULE_NAMES:
        assert RULES.get(name) is getattr(ds, name)
    with pytest.raises(ValueError, match="max_variance"):
        select("max_varience", torch.randn(2, 4), 2)
