"""MATH-style datasets: ``math`` (train: the 7 subsets of ``EleutherAI/hendrycks_math``; test: MATH-500),
and the evaluation sets ``math500`` (``HuggingFaceH4/MATH-500``) and ``amc23`` (``zwhe99/amc23``).

One builder serves all three; the YAML says where the records come from. Gold = the record's
``answer`` field when it has one (MATH-500, AMC23), else the content of the LAST \\boxed{...} in the
solution with braces matched (the authors cut at the first "}", breaking \\boxed{\\frac{1}{2}}).
"""

from __future__ import annotations

from pods.errors import ConfigError
from pods.tasks.base import DATASETS, TaskData
from pods.tasks.extract import canonical_number, last_boxed
from pods.tasks.hub import build_split, field, load_split


def math_gold(record: dict, where: str = "record") -> str:
    answer = record.get("answer")
    if answer is not None and str(answer).strip():
        if isinstance(answer, (int, float)):  # AMC23 stores 27.0
            return canonical_number(repr(float(answer))) or str(answer)
        return str(answer).strip()
    boxed = last_boxed(str(field(record, ("solution",), where)))
    if boxed is None:
        raise ConfigError(f"{where}: no 'answer' field and no closed \\boxed{{...}} in its solution")
    return boxed


@DATASETS.register("math")
@DATASETS.register("math500")
@DATASETS.register("amc23")
def build_math(ds) -> TaskData:
    splits, sources = {}, {}
    for split in ("train", "test"):
        records, sources[split] = load_split(ds, split)
        splits[split] = build_split(records, ds, split, ("problem", "question"), math_gold)
    return TaskData(train=splits["train"], test=splits["test"], meta={"source": sources})
