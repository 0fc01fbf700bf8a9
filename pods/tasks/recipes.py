"""Reward recipes, by name: each a sum of named terms (logged separately). The grader is passed in.

- ``correctness``: 1.0 if right. The authors' released MATH runs used only this.
- ``pods_3fc107e`` (alias ``pods_release``; the authors' release commit 3fc107e, the published Qwen GSM8K
  runs): 1.0 if right; only if wrong, a format bonus max(0, 0.1 - 0.001 x characters outside the
  think/answer match) and 0.025 per tag (<think>, </think>, <answer>, </answer>) appearing exactly once.
- ``pods_0c453d2`` (commit 0c453d2, with which the Llama results were committed; applied to every answer):
  1.0 if right + 0.01 x max(0, 1 - 0.01 x characters outside the match) + 0.0025 per tag seen once (max 1.02).
- ``pods_187f43b`` (alias ``pods_head``; the head commit 187f43b, utils/data.py): the same terms scaled by
  0.1 instead of 0.01: + 0.1 x max(0, 1 - 0.01 x extra characters) + 0.025 per tag (max 1.2).
- ``open_r1`` (their multi-GPU runs): accuracy + 1.0 if the completion is exactly
  ``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`` + 0.25 per newline-delimited tag seen once.
The "think/answer match" is the authors' greedy ``<think>.*</think>[ \\n]?<answer>.*</answer>``,
computed here with string searches so that adversarial text cannot make it quadratic.
"""

from __future__ import annotations

import re

from pods.tasks.base import RECIPES, Score

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
R1_TAGS = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
SCALE_0C453D2, SCALE_187F43B = 0.01, 0.1  # format 1 x scale, each tag 0.25 x scale
RELEASE_FORMAT_MAX, RELEASE_PER_CHAR, RELEASE_TAG_WEIGHT = 0.1, 0.001, 0.025

_JOIN = re.compile(r"</think>[ \n]?<answer>")


def think_answer_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the greedy match of ``<think>.*</think>[ \\n]?<answer>.*</answer>``, or None.

    The match starts at the first <think> and ends at the last </answer> whenever some
    ``</think>[ \\n]?<answer>`` lies between them, so three searches decide it.
    """
    start, end = text.find("<think>"), text.rfind("</answer>")
    if start < 0 or end < 0:
        return None
    join = _JOIN.search(text, start + len("<think>"))
    if join is None or join.end() > end:
        return None
    return start, end + len("</answer>")


def chars_outside(text: str) -> int | None:
    span = think_answer_span(text)
    return None if span is None else len(text) - (span[1] - span[0])


def pods_formatted(text: str) -> bool:
    """The authors' format check: ``^[ \\n]?<think>.*</think>[ \\n]?<answer>.*</answer>[ \\n]?$``."""
    s = text[:-1] if text.endswith("\n") else text  # "$" also matches before one final newline
    s = s[1:] if s[:1] in (" ", "\n") else s
    s = s[:-1] if s[-1:] in (" ", "\n") else s
    return think_answer_span(s) == (0, len(s))


def r1_formatted(text: str) -> bool:
    """open-r1's ``re.match(r"^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$", DOTALL | MULTILINE)``:
    starts with "<think>\\n", then "\\n</think>\\n<answer>\\n", then "\\n</answer>" ending a line. Computed
    with string searches (the regex backtracks quadratically on text with many "</think>" blocks)."""
    if not text.startswith("<think>\n"):
        return False
    i = text.find("\n</think>\n<answer>\n", len("<think>\n"))
    if i < 0:
        return False
    j = text.find("\n</answer>", i + len("\n</think>\n<answer>\n"))
    while j >= 0:
        end = j + len("\n</answer>")
        if end == len(text) or text[end] == "\n":
            return True
        j = text.find("\n</answer>", j + 1)
    return False


def tags_once(text: str, tags: tuple[str, ...] = TAGS) -> int:
    return sum(text.count(tag) == 1 for tag in tags)


@RECIPES.register("correctness")
def recipe_correctness(completion: str, gold: str, grade) -> Score:
    correct, extracted = grade(completion, gold)
    return Score(terms={"correct": float(correct)}, correct=correct, formatted=pods_formatted(completion), extracted=extracted)


@RECIPES.register("pods_release")
def recipe_pods_release(completion: str, gold: str, grade) -> Score:
    correct, extracted = grade(completion, gold)
    fmt = tags = 0.0
    if not correct:
        extra = chars_outside(completion)
        fmt = 0.0 if extra is None else max(0.0, RELEASE_FORMAT_MAX - RELEASE_PER_CHAR * extra)
        tags = RELEASE_TAG_WEIGHT * tags_once(completion)
    terms = {"correct": float(correct), "format": fmt, "tags": tags}
    return Score(terms=terms, correct=correct, formatted=pods_formatted(completion), extracted=extracted)


def _always_bonus(completion: str, gold: str, grade, scale: float) -> Score:
    """The later commits' recipe: correctness + scale x format score + scale x 0.25 per tag, on every answer."""
    correct, extracted = grade(completion, gold)
    extra = chars_outside(completion)
    fmt = 0.0 if extra is None else scale * max(0.0, 1.0 - 0.01 * extra)
    terms = {"correct": float(correct), "format": fmt, "tags": scale * 0.25 * tags_once(completion)}
    return Score(terms=terms, correct=correct, formatted=pods_formatted(completion), extracted=extracted)


# Module-level functions, not closures: a grading worker imports a recipe by name (pods.tasks.guard.sendable), and a
# closure would be scored in the training process with no time limit.
@RECIPES.register("pods_0c453d2")
def recipe_pods_0c453d2(completion: str, gold: str, grade) -> Score:
    return _always_bonus(completion, gold, grade, SCALE_0C453D2)


@RECIPES.register("pods_187f43b")
def recipe_pods_187f43b(completion: str, gold: str, grade) -> Score:
    return _always_bonus(completion, gold, grade, SCALE_187F43B)


RECIPES.register("pods_3fc107e")(recipe_pods_release)
RECIPES.register("pods_head")(recipe_pods_187f43b)


@RECIPES.register("open_r1")
def recipe_open_r1(completion: str, gold: str, grade) -> Score:
    correct, extracted = grade(completion, gold)
    formatted = r1_formatted(completion)
    terms = {"accuracy": float(correct), "format": float(formatted), "tags": 0.25 * tags_once(completion, R1_TAGS)}
    return Score(terms=terms, correct=correct, formatted=formatted, extracted=extracted)
