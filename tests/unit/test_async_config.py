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
    ],
)
def test_what_the_producer_cannot_run_is_a_one_line_error(overrides, named):
    from pods.config import validate

    with pytest.raises(ConfigError, match=named) as e:
        validate(compose(overrides))
    assert "\n" not in str(e.value)


TWO_RANKS = ["hardware=cpu_ddp2_zero3", "train.max_staleness=1"]  # DeepSpeed ZeRO-3 over 2 processes
SERVER = ["rollout=vllm_server", "rollout.servers=1", "rollout.port=8100", "rollout.max_model_len=256"]


@pytest.mark.parametrize("engine", ["hf", "sparse_hf"])
def test_two_ranks_with_a_policy_engine_are_refused_in_one_line_saying_why(engine, monkeypatch):
    """An engine that generates with the training module: under DeepSpeed it does so in lockstep over the ZeRO-3
    shards, which a producer thread cannot do while the module trains."""
    from pods.config import validate

    monkeypatch.setenv("WORLD_SIZE", "2")  # (torchrun's: the launcher check passes, the producer's does not)
    with pytest.raises(ConfigError, match=f"rollout.name={engine} runs in one process \\(this run has 2\\).*ZeRO-3") as e:
        validate(compose([*TWO_RANKS, f"rollout={engine}"]))
    assert "\n" not in str(e.value) and "rollout=vllm_server" in str(e.value)


def test_two_ranks_on_servers_pass_the_config_rules(monkeypatch):
    """``vllm_server`` holds its own copy of the weights; its producers' collectives run on a group of their own
    (``pods.distributed.Dist.fork``), so 2 ranks with k = 1 are accepted (the run: tests/vllm_cpu)."""
    from pods.config import validate

    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = validate(compose([*TWO_RANKS, *SERVER]))
    assert cfg.train.max_staleness == 1 and cfg.hardware.nproc_per_node == 2 and cfg.rollout.name == "vllm_server"


def test_the_default_is_the_synchronous_loop():
    assert check(compose([])).train.max_staleness == 0
