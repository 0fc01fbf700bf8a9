"""Fixtures shared by the vLLM-on-CPU test modules (module-scoped: one per module, as each module's engine is)."""

import pytest

from pods.schema import check
from support.config import compose


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from pods.models import load_tokenizer

    return load_tokenizer(str(tiny_dir))


@pytest.fixture(scope="module")
def toy_test_prompts(tok):
    """The toy task's test prompts, tokenized: ``toy_test_prompts[:k]``."""
    from pods.tasks import DATASETS, encode_prompts

    task = DATASETS.get("toy_arith")(check(compose()).dataset)
    return encode_prompts(task.test[:8], tok, None)[0]
