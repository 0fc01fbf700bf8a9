"""pods.eval.metrics: pass@k against brute-force enumeration of k-subsets; avg@n, maj@k and the macro average by hand."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pods.eval.metrics import Problem, benchmark_metrics, default_ks, macro_average, majority_correct, pass_at_k


def brute_pass_at_k(correct: list[bool], k: int) -> float:
    """The fraction of the C(n, k) k-subsets of the samples that hold at least one right sample."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_subset_enumeration_on_random_cases():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 12)
        correct = [rng.random() < rng.random() for _ in range(n)]
        k = rng.randint(1, n)
        # 1e-12: the product form rounds at most n times in float64 (relative error ~ n * 1.1e-16)
        assert pass_at_k(n, sum(correct), k) == pytest.approx(brute_pass_at_k(correct, k), abs=1e-12)


def test_pass_at_k_matches_the_binomial_formula_and_is_stable_at_large_n():
    for n, c, k in [(10, 3, 1), (10, 3, 5), (20, 0, 4), (20, 20, 4), (32, 1, 8)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)  # same float64 rounding bound as above
    # C(2000, 1000) overflows a float (about 1e600); the product form stays finite and exact to rounding
    assert 0.0 < pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-9)  # 1 right of 2000: half the 1000-subsets hold it


def test_pass_at_1_is_the_fraction_right_and_pass_at_n_is_any_right():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 0, 8) == 0.0


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 5, 1), (4, 1, 0)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_majority_by_hand():
    # answers 7, 5, 5, 7, 5 (right answer 5): first 2 -> 7 and 5 tie, 7 came first -> wrong; first 3 -> 5 twice -> right
    p = Problem(correct=(False, True, True, False, True), answers=("7", "5", "5", "7", "5"))
    assert [majority_correct(p, k) for k in (1, 2, 3, 4, 5)] == [False, False, True, False, True]
    none = Problem(correct=(False, False, True), answers=(None, None, "3"))
    assert not majority_correct(none, 2)  # no answer at all: wrong
    assert majority_correct(none, 3)  # None never wins the vote


def test_benchmark_metrics_by_hand():
    problems = [
        Problem(correct=(True, False, False, False), answers=("1", "2", "2", "3")),  # c = 1
        Problem(correct=(True, True, True, False), answers=("4", "4", "4", "5")),  # c = 3
    ]
    m = benchmark_metrics(problems, ks=[1, 2, 4])
    assert m["problems"] == 2 and m["samples"] == 4
    assert m["avg@n"] == pytest.approx((1 / 4 + 3 / 4) / 2)
    # pass@2: problem 1: 1 - C(3,2)/C(4,2) = 1 - 3/6; problem 2: 1 - C(1,2)/C(4,2) = 1
    assert m["pass@k"]["2"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["pass@k"]["4"] == 1.0
    # maj@4: problem 1 votes "2" (wrong), problem 2 votes "4" (right)
    assert m["maj@k"]["4"] == pytest.approx(0.5)
    assert m["maj@k"]["1"] == 1.0  # both first samples right


def test_benchmark_metrics_refuses_k_above_samples_and_ragged_counts():
    with pytest.raises(ValueError, match="outside"):
        benchmark_metrics([Problem((True,), ("1",))], ks=[2])
    with pytest.raises(ValueError, match="same number"):
        benchmark_metrics([Problem((True,), ("1",)), Problem((True, False), ("1", "2"))], ks=[1])


def test_macro_average_weighs_benchmarks_equally():
    a = {"avg@n": 1.0, "pass@k": {"1": 1.0, "8": 1.0}, "maj@k": {"1": 1.0}}
    b = {"avg@n": 0.0, "pass@k": {"1": 0.0}, "maj@k": {"1": 0.5}}
    m = macro_average({"a": a, "b": b})
    assert m["avg@n"] == 0.5 and m["pass@k"] == {"1": 0.5} and m["maj@k"] == {"1": 0.75}  # k = 8 is not in b


def test_default_ks():
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    assert default_ks(5) == [1, 2, 4, 5]
    assert default_ks(1) == [1]
