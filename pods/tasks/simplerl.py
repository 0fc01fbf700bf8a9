"""SimpleRL-Zoo's training data (``dataset=simplerl_zoo``): MATH problems of levels 3-5, the set Sparse-RL trains on.

Records come in two shapes, both read here:
- the hub's (``hkust-nlp/SimpleRL-Zoo-Data``, folder ``simplelr_qwen_level3to5``, 8,523 problems): ``question`` and
  ``gt_answer``;
- Sparse-RL's released copy (``dataset/simplelr_qwen_level3to5/train.jsonl`` of github lsjia/Sparse-RL, the same
  8,523 problems): ``prompt``, the Qwen chat text already rendered around the question, and ``label``; its Llama copy
  (``simplelr_level3to5``) holds the chat as a list of messages instead.

The question is taken out of a rendered prompt (the user turn, without the step-by-step instruction), so the prompt
the model sees is ``dataset.prompt_format``'s (``boxed``: the same chat, see pods.tasks.prompts). The test split
defaults to MATH-500 (records with ``answer``). Gold: ``gt_answer`` | ``label`` | ``answer`` | the last \\boxed{} of
a ``solution``.
"""

from __future__ import annotations

import re

from pods.tasks.base import DATASETS, TaskData
from pods.tasks.hub import build_split, load_split
from pods.tasks.mathds import math_gold

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)  # the user turn of a rendered Qwen (ChatML) prompt
_INSTRUCTION = re.compile(r"\s*Please reason step by step, and put your final answer within \\boxed\{+\}+\.?\s*$")


def question_of(record: dict) -> str | None:
    """The bare question of a record: its ``question``/``problem`` field, else the user turn of its ``prompt`` (a
    rendered chat string or a list of messages) without the step-by-step instruction; None if there is neither."""
    for key in ("question", "problem"):
        if record.get(key) is not None:
            return str(record[key])
    prompt = record.get("prompt")
    if isinstance(prompt, list):  # [{"role": ..., "content": ...}, ...]
        user = next((m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"), None)
    elif isinstance(prompt, str):
        found = _USER.search(prompt)
        user = found.group(1) if found else prompt
    else:
        return None
    return None if user is None else _INSTRUCTION.sub("", user)


def _question(record: dict, where: str) -> str:
    q = question_of(record)
    if q is None:
        raise ValueError(f"{where}: no 'question', 'problem' or 'prompt' field (keys: {sorted(record)})")
    return q


def simplerl_gold(record: dict, where: str = "record") -> str:
    for key in ("gt_answer", "label"):
        if record.get(key) is not None and str(record[key]).strip():
            return str(record[key]).strip()
    return math_gold(record, where)  # ``answer``, else the last \boxed{} of ``solution``


@DATASETS.register("simplerl_zoo")
def build_simplerl(ds) -> TaskData:
    splits, sources = {}, {}
    for split in ("train", "test"):
        records, sources[split] = load_split(ds, split)
        records = [{**r, "question": _question(r, f"dataset '{ds.name}' {split} record {i}")} for i, r in enumerate(records)]
        splits[split] = build_split(records, ds, split, ("question",), simplerl_gold)
    return TaskData(train=splits["train"], test=splits["test"], meta={"source": sources})
