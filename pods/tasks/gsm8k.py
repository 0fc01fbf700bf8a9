"""GSM8K (hub ``openai/gsm8k``, config ``main``: train 7473 / test 1319). Gold = text after "####", commas removed."""

from __future__ import annotations

from pods.errors import ConfigError
from pods.tasks.base import DATASETS, TaskData
from pods.tasks.extract import after_hashes
from pods.tasks.hub import build_split, field, load_split


def gsm8k_gold(solution: str) -> str | None:
    """``"... so 70,000\\n#### 70,000"`` -> ``"70000"``; None when there is no "####"."""
    tail = after_hashes(solution)
    return tail.replace(",", "") if tail else None


def _gold(record: dict, where: str) -> str:
    gold = gsm8k_gold(str(field(record, ("answer",), where)))
    if gold is None:
        raise ConfigError(f"{where}: no '####' final answer in its 'answer' field")
    return gold


@DATASETS.register("gsm8k")
@DATASETS.register("gsm8k_open_r1")  # the same data; conf/dataset/gsm8k_open_r1.yaml changes prompt and reward
def build_gsm8k(ds) -> TaskData:
    splits, sources = {}, {}
    for split in ("train", "test"):
        records, sources[split] = load_split(ds, split)
        splits[split] = build_split(records, ds, split, ("question",), _gold)
    return TaskData(train=splits["train"], test=splits["test"], meta={"source": sources})
