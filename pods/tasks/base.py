"""The task interface: what a dataset, a grader and a reward recipe are.

- A dataset builder ``fn(cfg: dict) -> TaskData`` returns train/test lists of ``Example``.
- A grader ``fn(completion: str, gold: str) -> (correct: bool, extracted: str | None)`` decides correctness.
- A reward recipe ``fn(completion: str, gold: str, grade) -> Score`` sums named terms; ``grade`` is the
  grader chosen in the config, so recipe and grader vary independently.
Model text is data: graders parse it, never evaluate it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pods.registry import Registry

DATASETS = Registry("dataset")
GRADERS = Registry("grader")
RECIPES = Registry("reward recipe")

Grader = Callable[[str, str], "tuple[bool, str | None]"]


@dataclass(frozen=True)
class Example:
    messages: tuple[dict, ...]  # chat turns before the assistant's answer (system/user)
    gold: str  # gold answer string, already extracted
    id: str = ""
    prompt_text: str | None = None  # raw prompt for base models: used as-is instead of the chat template


@dataclass
class TaskData:
    train: list[Example]
    test: list[Example]
    meta: dict = field(default_factory=dict)


@dataclass
class Score:
    terms: dict[str, float]  # named reward terms, logged separately; reward = their sum
    correct: bool
    formatted: bool
    extracted: str | None = None
    timed_out: bool = False

    @property
    def reward(self) -> float:
        return float(sum(self.terms.values()))


def score_batch(completions: list[str], golds: list[str], recipe: str, grader: str) -> list[Score]:
    """Score completions[i] against golds[i] with the named recipe and grader."""
    recipe_fn, grade = RECIPES.get(recipe), GRADERS.get(grader)
    return [recipe_fn(c, g, grade) for c, g in zip(completions, golds)]


def encode_prompts(examples: list[Example], tokenizer, max_prompt_length: int | None) -> tuple[list[list[int]], list[Example], int]:
    """Apply the chat template and tokenize; drop prompts longer than ``max_prompt_length`` tokens.

    Returns (token ids, kept examples, number dropped).
    """
    ids, kept = [], []
    for ex in examples:
        if ex.prompt_text is not None:
            toks = tokenizer(ex.prompt_text, add_special_tokens=False)["input_ids"]
        else:
            toks = tokenizer.apply_chat_template(list(ex.messages), add_generation_prompt=True, tokenize=True)
            if hasattr(toks, "keys"):  # some tokenizers return a BatchEncoding
                toks = toks["input_ids"]
        toks = list(toks)
        if max_prompt_length is not None and len(toks) > max_prompt_length:
            continue
        ids.append(toks)
        kept.append(ex)
    return ids, kept, len(examples) - len(kept)
