"""The CPU toy task: "What is a + b? Answer in format: 'Answer: {result}'" (the PODS slides' example).

Reward ``toy`` = 0.8 for the right number + 0.2 for the exact format, so rewards are graded, not binary.
Train and test splits are disjoint sets of (a, b) pairs drawn from a seed.
"""

from __future__ import annotations

import random
import re

from pods.schema import ToyDataset
from pods.tasks.base import DATASETS, GRADERS, RECIPES, DatasetSpec, Example, Score, TaskData

QUESTION = "What is {a} + {b}? Answer in format: 'Answer: {{result}}'"
ANSWER = "Answer: {result}"
_FORMAT = re.compile(r"^\s*Answer: (-?\d+)\s*$")
_LAST_INT = re.compile(r"-?\d+")


def toy_example(a: int, b: int) -> Example:
    return Example(messages=({"role": "user", "content": QUESTION.format(a=a, b=b)},), gold=str(a + b), id=f"{a}+{b}")


def canonical(ex: Example) -> str:
    """The right answer in the asked format ("Answer: 35"): the warm start's target and the eval's ``answer_prob``."""
    return ANSWER.format(result=ex.gold)


@DATASETS.register("toy_arith", spec=DatasetSpec(sft_target=canonical))
def toy_arith(ds: ToyDataset) -> TaskData:
    lo, hi = ds.low, ds.high
    n_train, n_test = ds.train_size, ds.test_size
    pairs = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]
    if n_train + n_test > len(pairs):
        raise ValueError(
            f"dataset.train_size + dataset.test_size = {n_train + n_test} exceeds the {len(pairs)} distinct pairs in [{lo}, {hi}]"
        )
    random.Random(ds.seed).shuffle(pairs)
    test, train = pairs[:n_test], pairs[n_test : n_test + n_train]
    return TaskData(train=[toy_example(a, b) for a, b in train], test=[toy_example(a, b) for a, b in test], meta={"range": [lo, hi]})


@GRADERS.register("toy")
def grade_toy(completion: str, gold: str) -> tuple[bool, str | None]:
    """Right if the last integer in the completion equals the gold sum."""
    nums = _LAST_INT.findall(completion[-200:])
    extracted = nums[-1] if nums else None
    return extracted is not None and len(extracted) < 20 and int(extracted) == int(gold), extracted


@RECIPES.register("toy")
def recipe_toy(completion: str, gold: str, grade) -> Score:
    correct, extracted = grade(completion, gold)
    formatted = _FORMAT.match(completion) is not None
    return Score(terms={"correct": 0.8 * correct, "format": 0.2 * formatted}, correct=correct, formatted=formatted, extracted=extracted)
