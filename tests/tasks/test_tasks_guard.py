"""Time limits: a call that hangs (in Python or inside C code) is killed at its deadline and scores 0 as
timed out; a few thousand adversarial completions all finish within the limit with no exception escaping."""

from __future__ import annotations

import random
import time
import warnings

import pytest

from pods.tasks import GRADERS, RECIPES, score_batch
from pods.tasks.base import zero_score
from pods.tasks.guard import GradingPool, get_pool, sendable

TIMEOUT_S = 3.0
SLACK_S = 1.0  # select() wake-up and process-kill latency on a busy 2-core machine


@pytest.fixture(scope="module")
def pool():
    p = GradingPool(workers=2)
    yield p
    p.close()


def test_pool_returns_values_in_order(pool):
    results = pool.map(divmod, [(i, 7) for i in range(50)], timeout_s=TIMEOUT_S)
    assert [r.value for r in results] == [divmod(i, 7) for i in range(50)]
    assert all(r.status == "ok" for r in results)


def test_hangs_in_python_and_in_c_are_killed_at_the_deadline(pool):
    start = time.monotonic()
    # time.sleep stands for a slow parse; pow(9, 10**12) never returns and ignores signals (C code)
    results = pool.map(pow, [(2, 10), (9, 10**12), (3, 3)], timeout_s=1.0)
    assert [r.status for r in results] == ["ok", "timeout", "ok"]
    assert results[0].value == 1024 and results[2].value == 27
    assert time.monotonic() - start < 1.0 + 5.0  # includes starting the replacement worker
    assert pool.map(time.sleep, [(5,)], timeout_s=0.5)[0].status == "timeout"
    assert pool.map(abs, [(-1,)], timeout_s=1.0)[0].value == 1  # the replacement serves


def test_errors_are_reported_not_raised(pool):
    result = pool.map(int, [("not a number",)], timeout_s=1.0)[0]
    assert result.status == "error" and "ValueError" in result.value


def slow_grader(completion: str, gold: str) -> tuple[bool, str | None]:
    """A grader that hangs on request (module level, so a worker can import it by name)."""
    if completion == "hang":
        time.sleep(60)
    return completion == gold, completion


def test_timeout_scores_zero_on_every_term_and_is_counted():
    s = zero_score(RECIPES.get("pods_release"), timed_out=True, error="timed out after 5s")
    assert s.terms == {"correct": 0.0, "format": 0.0, "tags": 0.0} and s.reward == 0.0 and s.timed_out and not s.correct


def test_score_batch_times_out_a_hanging_grader(monkeypatch):
    monkeypatch.setitem(GRADERS._items, "test_slow", slow_grader)
    start = time.monotonic()
    scores = score_batch(["18", "hang", "17"], ["18"] * 3, "pods_release", "test_slow", timeout_s=1.0)
    assert time.monotonic() - start < 1.0 + 10.0
    assert [s.correct for s in scores] == [True, False, False]
    assert [s.timed_out for s in scores] == [False, True, False]
    assert scores[1].terms == {"correct": 0.0, "format": 0.0, "tags": 0.0} and "timed out after 1s" in scores[1].error
    assert scores[2].terms["tags"] == 0.0 and scores[2].error is None


def test_functions_a_worker_cannot_import_are_scored_in_process_with_a_warning(monkeypatch):
    monkeypatch.setitem(GRADERS._items, "test_lambda", lambda completion, gold: (completion == gold, completion))
    with pytest.warns(UserWarning, match="not importable by name"):
        scores = score_batch(["18", "17"], ["18", "18"], "correctness", "test_lambda")
    assert [s.correct for s in scores] == [True, False]


def test_every_shipped_recipe_and_grader_is_graded_in_a_worker_under_the_time_limit():
    """A closure or lambda in a registry would be scored in the training process with no time limit (pods_head,
    pods_187f43b and pods_0c453d2 were closures until session 6)."""
    import pods.tasks  # noqa: F401  every task module registers its recipe and grader

    for registry in (RECIPES, GRADERS):
        for name in sorted(registry._items):
            assert sendable(registry.get(name)), f"{name} is not importable by name in a grading worker"


def _adversarial(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    latex = [
        "\\frac{",
        "}{",
        "}",
        "{",
        "\\sqrt{",
        "^",
        "_",
        "\\boxed{",
        "\\left(",
        "\\right)",
        "(",
        ")",
        "[",
        "]",
        "\\text{",
        "$",
        "\\$",
        "9",
        "99999",
        "x",
        "\\cdot",
        "!",
        "\\sum_{i=1}^{",
        "\\int",
        "\\infty",
        "=",
        ",",
        "\\\\",
        "<answer>",
        "</answer>",
        "<think>",
        "</think>",
        "####",
        "\\begin{pmatrix}",
        "\\end{pmatrix}",
        "&",
        "e",
        ".",
    ]
    uni = ["∞", "√", "½", "٣", "𝟙𝟠", "\u202e", "\u0301", "\ufeff", "😀", "\x00", "\ud800", "中文", "Ⅻ"]
    makers = [
        lambda: "\\boxed{" + "9^{" * rng.randint(2, 60) + "9" + "}" * rng.randint(0, 60) + "}",
        lambda: "$" + "^".join(["9"] * rng.randint(2, 50)) + "$",
        lambda: "\\boxed{" + rng.choice(["10", "2", "x+1", "(x+1)"]) + "^{" + str(10 ** rng.randint(3, 12)) + "}}",
        lambda: "\\boxed{" + str(rng.randint(10**3, 10**12)) + "!}",
        lambda: "\\boxed{" + "9" * rng.randint(1000, 200_000) + "}",
        lambda: "<answer>" + "(" * rng.randint(50, 20_000) + "1" + ")" * rng.randint(0, 20_000) + "</answer>",
        lambda: "\\boxed{" + "{" * rng.randint(50, 20_000) + "1" + "}" * rng.randint(0, 20_000),
        lambda: "\\frac{" * rng.randint(10, 5000) + "1",
        lambda: "".join(rng.choice(latex) for _ in range(rng.randint(1, 400))),
        lambda: "".join(rng.choice(uni) for _ in range(rng.randint(1, 200))) + " \\boxed{½}",
        lambda: "<think>\n" * rng.randint(100, 20_000) + "\n</think>\n<answer>\n" * rng.randint(1, 3000),
        lambda: "x" * rng.randint(10_000, 300_000) + " \\boxed{18}",
        lambda: "\\boxed{" + "+".join(["x^{" + str(rng.randint(1, 99)) + "}"] * rng.randint(100, 3000)) + "}",
        lambda: (
            "\\boxed{\\begin{pmatrix}" + "&".join(["1"] * rng.randint(10, 500)) + "\\end{pmatrix}^{" + str(rng.randint(2, 10**6)) + "}}"
        ),
        lambda: "#### " + "-" * rng.randint(1, 1000) + "1e" + str(rng.randint(10, 10**9)),
        lambda: "\\boxed{\\sum_{i=1}^{10^{" + str(rng.randint(5, 100)) + "}} i^{" + str(rng.randint(2, 999)) + "}}",
    ]
    out = [rng.choice(makers)() for _ in range(n)]
    return out + ["a" * 1_000_000 + " 18", "\\boxed{" * 200_000, "(" * 500_000]  # three 1 MB-class strings


@pytest.mark.slow  # 6-7 s each: make test-all
@pytest.mark.parametrize("seed,grader,recipe", [(1, "lenient", "pods_release"), (2, "math_verify", "open_r1"), (3, "boxed", "pods_head")])
def test_fuzz_adversarial_completions_finish_within_the_limit(seed, grader, recipe):
    completions = _adversarial(1000, seed=seed)
    golds = [random.Random(i).choice(["18", "\\frac{1}{2}", "x^2+1", "9^{9}"]) for i in range(len(completions))]
    get_pool().last_stats = {}  # the stats read below are this call's, not an earlier test's
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scoring in this process (no time limit) warns: fail instead
        scores = score_batch(completions, golds, recipe, grader, timeout_s=TIMEOUT_S)
    stats = get_pool().last_stats
    assert len(scores) == len(completions)
    assert stats["max_seconds"] <= TIMEOUT_S + SLACK_S, stats
    assert stats["errors"] == 0, [s.error for s in scores if s.error and not s.timed_out][:3]  # graders never raise
    for s in scores:
        if s.timed_out:
            assert s.reward == 0.0 and not s.correct and s.error
    print(f"{grader}/{recipe}: {len(scores)} adversarial completions in {time.monotonic() - start:.1f}s, {stats}")
