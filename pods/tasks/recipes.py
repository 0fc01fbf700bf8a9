"""Reward recipes, by name: each a sum of named terms (logged separately). The grader is passed in.

- ``correctness``: 1.0 if right. The authors' released MATH runs used only this.
- ``pods_release`` (the published Qwen GSM8K runs): 1.0 if right; only if wrong, a format bonus
  max(0, 0.1 - 0.001 x characters outside the think/answer match) and 0.025 per tag
  (<think>, </think>, <answer>, </answer>) appearing exactly once.
- ``pods_head`` (the authors' later single-GPU code, applied to every answer): 1.0 if right
  + 0.01 x max(0, 1 - 0.01 x characters outside the match) + 0.0025 per tag appearing once (max 1.02).
  Note: paper-facts.md quotes 0.1 and 0.025 here; the code read (utils/data.py at 0c453d2) scales the
  format and tag rewards by 0.01 (0.01 x 1 and 0.01 x 0.25). The constants below follow the code.
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
HEAD_FORMAT_WEIGHT, HEAD_TAG_WEIGHT = 0.01, 0.0025
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


@RECIPES.register("pods_head")
def recipe_pods_head(completion: str, gold: str, grade) -> Score:
    correct, extracted = grade(completion, gold)
    extra = chars_outside(completion)
    fmt = 0.0 if extra is None else HEAD_FORMAT_WEIGHT * max(0.0, 1.0 - 0.01 * extra)
    terms = {"correct": float(correct), "format": fmt, "tags": HEAD_TAG_WEIGHT * tags_once(completion)}
    return Score(terms=terms, correct=correct, formatted=pods_formatted(completion), extracted=extracted)


@RECIPES.register("open_r1")
def recipe_open_r1(completion: str, gold: str, grade) -> Score:
    correct, extracted = grade(completion, gold)
    formatted = r1_formatted(completion)
    terms = {"accuracy": float(correct), "format": float(formatted), "tags": 0.25 * tags_once(completion, R1_TAGS)}
    return Score(terms=terms, correct=correct, formatted=formatted, extracted=extracted)
