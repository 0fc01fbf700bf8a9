"""The task interface: what a dataset, a grader and a reward recipe are.

- A dataset builder ``fn(cfg: dict) -> TaskData`` returns train/test lists of ``Example``; its ``DatasetSpec``
  (``DATASETS.spec(name)``) may give the answer the tiny model's warm start imitates (``sft_target``).
- A grader ``fn(completion: str, gold: str) -> (correct: bool, extracted: str | None)`` decides correctness.
- A reward recipe ``fn(completion: str, gold: str, grade) -> Score`` sums named terms; ``grade`` is the
  grader chosen in the config, so recipe and grader vary independently.
Model text is data: graders parse it, never evaluate it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pods.registry import Registry


@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset offers besides its examples (registered with it)."""

    sft_target: Callable | None = None  # ``fn(Example) -> str``: the answer text the tiny model's warm start trains on (pods.tiny)


DATASETS = Registry("dataset", spec=DatasetSpec)
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
    error: str | None = None  # why the score is zero when grading failed ("timed out after 5s", ...)

    @property
    def reward(self) -> float:
        return float(sum(self.terms.values()))


def score_batch(
    completions: list[str], golds: list[str], recipe: str, grader: str, timeout_s: float | None = 5.0, workers: int | None = None
) -> list[Score]:
    """Score completions[i] against golds[i] with the named recipe and grader.

    Each call runs in a grading worker process under a ``timeout_s`` deadline (pods.tasks.guard); a call
    that times out or fails scores 0 on every term with ``timed_out``/``error`` set. ``timeout_s=None``
    scores in this process with no time limit (debugging only: model text can hang sympy).
    """
    recipe_fn, grade = RECIPES.get(recipe), GRADERS.get(grader)
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions but {len(golds)} golds")
    if timeout_s is None or not completions:
        return [recipe_fn(c, g, grade) for c, g in zip(completions, golds)]
    from pods.tasks.guard import get_pool, sendable

    if not (sendable(recipe_fn) and sendable(grade)):
        import warnings

        warnings.warn(
            f"recipe '{recipe}' or grader '{grader}' is not importable by name (a lambda, a closure, "
            f"defined in __main__): scoring in this process without a time limit",
            stacklevel=2,
        )
        return [recipe_fn(c, g, grade) for c, g in zip(completions, golds)]

    results = get_pool(workers).map(recipe_fn, [(c, g, grade) for c, g in zip(completions, golds)], timeout_s)
    return [r.value if r.status == "ok" else zero_score(recipe_fn, r.status == "timeout", str(r.value)) for r in results]


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (Yu et al., arXiv 2503.14476, eq. 13) as a reward term: 0 for a completion of at
    most ``max_tokens - buffer`` tokens, then falling linearly to ``-penalty`` at ``max_tokens`` (``sampling.max_tokens``,
    where generation stops): -penalty x (length - (max_tokens - buffer)) / buffer, clipped to [-penalty, 0]."""
    over = length - (max_tokens - buffer)
    return -penalty * min(over / buffer, 1.0) if over > 0 else 0.0


def zero_score(recipe_fn: Callable, timed_out: bool, error: str) -> Score:
    """All of the recipe's terms at 0 (the term names come from scoring an empty completion)."""
    terms = recipe_fn("", "", lambda completion, gold: (False, None)).terms
    return Score(terms={k: 0.0 for k in terms}, correct=False, formatted=False, timed_out=timed_out, error=error)


def encode_prompts(
    examples: list[Example], tokenizer, max_prompt_length: int | None, chat_template_kwargs: dict | None = None
) -> tuple[list[list[int]], list[Example], int]:
    """Apply the chat template (with ``chat_template_kwargs``, the model section's: Qwen3's ``enable_thinking``) and
    tokenize; drop prompts longer than ``max_prompt_length`` tokens.

    Returns (token ids, kept examples, number dropped).
    """
    kwargs = dict(chat_template_kwargs or {})
    ids, kept = [], []
    for ex in examples:
        if ex.prompt_text is not None:
            toks = tokenizer(ex.prompt_text, add_special_tokens=False)["input_ids"]
        else:
            toks = tokenizer.apply_chat_template(list(ex.messages), add_generation_prompt=True, tokenize=True, **kwargs)
            if hasattr(toks, "keys"):  # some tokenizers return a BatchEncoding
                toks = toks["input_ids"]
        toks = list(toks)
        if max_prompt_length is not None and len(toks) > max_prompt_length:
            continue
        ids.append(toks)
        kept.append(ex)
    return ids, kept, len(examples) - len(kept)
