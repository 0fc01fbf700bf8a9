"""``train.max_staleness`` refused in one line where the producer cannot run exactly (docs/async.md, "Limits"), and
its default is the synchronous loop."""

from __future__ import annotations

import pytest

from pods.errors import ConfigError
from pods.schema import check
from support.config import compose


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["train.max_staleness=-1"], "train.max_staleness must be >= 0"),
        (["train.max_staleness=1", "hardware.finetune=lora", "hardware.lora.dropout=0.1"], "needs hardware.lora.dropout=0"),
        (["train.max_staleness=1", "hardware.nproc_per_node=2"], "runs in one process for now; this run has 2"),
    ],
)
def test_what_the_producer_cannot_run_is_a_one_line_error(overrides, named, monkeypatch):
    from pods.config import validate

    if "hardware.nproc_per_node=2" in overrides:
        monkeypatch.setenv("WORLD_SIZE", "2")  # (torchrun's: the launcher check passes, the producer's does not)
    with pytest.raises(ConfigError, match=named) as e:
        validate(compose(overrides))
    assert "\n" not in str(e.value)


def test_the_default_is_the_synchronous_loop():
    assert check(compose([])).train.max_staleness == 0
