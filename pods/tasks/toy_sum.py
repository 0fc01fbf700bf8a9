"""A CPU task of mixed difficulty for D3S: add 2-5 two-digit numbers step by step, binary reward.

"Add step by step: 23 + 45 + 12." -> "23+45=68 68+12=80 Answer: 80" (the answer format of ``pods.tasks.toy_long``,
whose warm-started tiny model this task's model continues from). The term count is drawn uniformly per training
prompt, so every step mixes easy (2 terms, ~15-token answers) and hard (5 terms, ~45 tokens) prompts: the
between-group spread of difficulty that D3S's cross-group selection feeds on. The test split is stratified: the same
number of prompts per term count, in term-count order (``strata``). Reward ``toy_sum``: 1 if the completion ends in
"Answer: N" with N the sum, else 0 (binary, so a group is all-right or all-wrong whenever its prompt is easy or hard
enough for the policy).
"""

from __future__ import annotations

import random
import re

from pods.schema import ToyLongDataset
from pods.tasks.base import DATASETS, RECIPES, DatasetSpec, Example, Score, TaskData
from pods.tasks.toy_long import QUESTION, sft_target

_END = re.compile(r"Answer: (-?\d+)\s*$")


def sum_example(terms: tuple[int, ...]) -> Example:
    text = QUESTION.format(terms=" + ".join(map(str, terms)))
    return Example(messages=({"role": "user", "content": text},), gold=str(sum(terms)), id="+".join(map(str, terms)))


def terms_of(ex: Example) -> int:
    """The example's term count (its difficulty stratum)."""
    return ex.id.count("+") + 1


def _draw(rng: random.Random, k: int, lo: int, hi: int, seen: set) -> tuple[int, ...]:
    while True:
        terms = tuple(rng.randint(lo, hi) for _ in range(k))
        if terms not in seen:
            seen.add(terms)
            return terms


@DATASETS.register("toy_sum", spec=DatasetSpec(sft_target=sft_target))
def toy_sum(ds: ToyLongDataset) -> TaskData:
    """Test: ``test_size // strata`` prompts per term count (drawn first, so the test set does not depend on
    ``train_size``); train: ``train_size`` prompts, each with a uniformly drawn term count, disjoint from the test."""
    strata = list(range(ds.min_terms, ds.max_terms + 1))
    if ds.min_terms > ds.max_terms:
        raise ValueError(f"dataset.min_terms ({ds.min_terms}) must be <= dataset.max_terms ({ds.max_terms})")
    rng, seen = random.Random(ds.seed), set()
    per = ds.test_size // len(strata)
    test = [sum_example(_draw(rng, k, ds.low, ds.high, seen)) for k in strata for _ in range(per)]
    train = [sum_example(_draw(rng, rng.choice(strata), ds.low, ds.high, seen)) for _ in range(ds.train_size)]
    return TaskData(train=train, test=test, meta={"terms": [ds.min_terms, ds.max_terms], "test_per_stratum": per})


@RECIPES.register("toy_sum")
def recipe_toy_sum(completion: str, gold: str, grade) -> Score:
    """1 for a completion ending in "Answer: <gold>", else 0; ``correct`` is the same event."""
    end = _END.search(completion)
    right = end is not None and grade(end.group(1), gold)[0]
    return Score(terms={"correct": float(right)}, correct=right, formatted=end is not None, extracted=end.group(1) if end else None)
