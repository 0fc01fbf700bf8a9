"""toy_sum, the mixed-difficulty task of the D3S ablation: binary grading, the stratified test split, answer lengths,
and the prompt length that names a term count (what ``train.log_strata`` logs by)."""

from __future__ import annotations

from collections import Counter

import pytest

from pods.schema import ConfigError, ToyLongDataset, complete
from pods.tasks import DATASETS, RECIPES
from pods.tasks.base import GRADERS
from pods.tasks.toy_sum import terms_of


def _data(**kw):
    node = {"name": "toy_sum", "recipe": "toy_sum", "grader": "toy", "min_terms": 2, "max_terms": 5, "train_size": 400, "test_size": 40}
    return DATASETS.get("toy_sum")(complete(ToyLongDataset, {**node, **kw}))


def test_binary_reward_needs_the_sum_after_answer_at_the_end():
    grade, toy = RECIPES.get("toy_sum"), GRADERS.get("toy")
    right = grade("23+45=68 68+12=80 Answer: 80", "80", toy)
    assert right.reward == 1.0 and right.correct and right.formatted and right.extracted == "80"
    assert grade("23+45=68 68+12=81 Answer: 81", "80", toy).reward == 0.0  # a wrong carry
    assert grade("23+45=68 68+12=80", "80", toy).reward == 0.0  # the right number, no "Answer: N"
    assert grade("Answer: 80 and more", "80", toy).reward == 0.0  # text after the answer
    assert set(right.terms) == {"correct"}  # one term: binary, no format bonus


def test_test_split_is_stratified_by_term_count_and_disjoint_from_train():
    data = _data()
    strata = [terms_of(ex) for ex in data.test]
    assert strata == sorted(strata) and Counter(strata) == {2: 10, 3: 10, 4: 10, 5: 10}
    assert {ex.id for ex in data.test}.isdisjoint(ex.id for ex in data.train)
    mix = Counter(terms_of(ex) for ex in data.train)
    assert set(mix) == {2, 3, 4, 5} and min(mix.values()) > 60  # uniform over 2-5: every step mixes difficulties
    assert all(int(ex.gold) == sum(map(int, ex.id.split("+"))) for ex in data.train + data.test)
    assert _data(train_size=100).test == data.test  # the test split does not depend on train_size


def test_answers_are_15_to_50_tokens_and_the_prompt_length_names_the_term_count():
    from pods.tasks import encode_prompts
    from pods.tiny import ASSETS, load_tokenizer

    tok = load_tokenizer(ASSETS / "tiny-644515233365")  # toy_sum's model keeps the toy_long model's tokenizer
    data = _data()
    target = DATASETS.spec("toy_sum").sft_target
    lengths = {terms_of(ex): len(tok(target(ex) + "<|im_end|>", add_special_tokens=False)["input_ids"]) for ex in data.test}
    assert 15 <= lengths[2] < lengths[3] < lengths[4] < lengths[5] <= 50, lengths
    ids, _, _ = encode_prompts(data.test, tok, None)
    assert {terms_of(ex): len(p) for ex, p in zip(data.test, ids)} == {2: 22, 3: 26, 4: 30, 5: 34}


def test_min_terms_above_max_terms_is_one_line():
    with pytest.raises((ConfigError, ValueError), match="min_terms"):
        _data(min_terms=4, max_terms=3)
