"""A CPU task with 30-70-token answers, for compressed-KV rollouts: add k two-digit numbers step by step.

"Add step by step: 23 + 45 + 12 + 31." -> "23+45=68 68+12=80 80+31=111 Answer: 111". Each step needs the
running sum (recent) and the next operand (in the prompt, far back), so a cache that evicts the prompt hurts.
Reward ``toy_long`` = 0.8 for the right final number + 0.2 for ending in "Answer: N". Disjoint train/test
splits from a seed. Its ``DatasetSpec.sft_target`` is the step-by-step answer the tiny model's warm start imitates.
"""

from __future__ import annotations

import random
import re

from pods.schema import ToyLongDataset
from pods.tasks.base import DATASETS, RECIPES, DatasetSpec, Example, Score, TaskData

QUESTION = "Add step by step: {terms}."
_END = re.compile(r"Answer: (-?\d+)\s*$")


def solution(terms: list[int]) -> str:
    """The step-by-step answer: running sums, then 'Answer: total'."""
    steps, acc = [], terms[0]
    for t in terms[1:]:
        steps.append(f"{acc}+{t}={acc + t}")
        acc += t
    return " ".join(steps) + f" Answer: {acc}"


def sft_target(ex: Example) -> str:
    return solution([int(x) for x in ex.id.split("+")])


@DATASETS.register("toy_long", spec=DatasetSpec(sft_target=sft_target))
def toy_long(ds: ToyLongDataset) -> TaskData:
    lo, hi = ds.low, ds.high
    kmin, kmax = ds.min_terms, ds.max_terms
    n_train, n_test = ds.train_size, ds.test_size
    rng, seen, items = random.Random(ds.seed), set(), []
    while len(items) < n_train + n_test:
        terms = tuple(rng.randint(lo, hi) for _ in range(rng.randint(kmin, kmax)))
        if terms not in seen:
            seen.add(terms)
            items.append(terms)
    ex = [
        Example(
            messages=({"role": "user", "content": QUESTION.format(terms=" + ".join(map(str, t)))},),
            gold=str(sum(t)),
            id="+".join(map(str, t)),
        )
        for t in items
    ]
    return TaskData(train=ex[n_test:], test=ex[:n_test], meta={"terms": [kmin, kmax]})


@RECIPES.register("toy_long")
def recipe_toy_long(completion: str, gold: str, grade) -> Score:
    correct, extracted = grade(completion, gold)
    formatted = _END.search(completion) is not None
    return Score(terms={"correct": 0.8 * correct, "format": 0.2 * formatted}, correct=correct, formatted=formatted, extracted=extracted)
