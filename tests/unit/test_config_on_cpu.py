"""The config tree: every group option composes, YAML names are registered, bad configs fail fast."""

from __future__ import annotations

import time

import pytest

from pods.config import ConfigError, validate
from support.config import CONF, compose, shrink
from support.doors import door

GROUPS = ["model", "dataset", "hardware", "rollout", "algorithm", "logger"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_group_option_composes(group, option):
    cfg = compose([f"{group}={option}"])
    assert cfg[group]["name"] == option  # the file's name is its `name`, so logs and paths agree


def test_every_experiment_composes():
    exps = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    assert {"demo_grpo_cpu", "demo_pods_cpu"} <= set(exps)
    for exp in exps:
        cfg = compose([f"experiment={exp}"])
        first = (CONF / "experiment" / f"{exp}.yaml").read_text().splitlines()
        assert first[0] == "# @package _global_" and f"experiment={exp}" in first[1], f"{exp}: first comment must be its command"
        assert cfg["algorithm"]["m"] <= cfg["algorithm"]["n"]


def test_yaml_names_are_registered_names():
    from pods.backends import BACKENDS
    from pods.downsample import RULES
    from pods.engines import ENGINES
    from pods.tasks import DATASETS, GRADERS, RECIPES

    for _, option in [o for o in OPTIONS if o[0] == "algorithm"]:
        assert compose([f"algorithm={option}"])["algorithm"]["rule"] in RULES
    for _, option in [o for o in OPTIONS if o[0] == "dataset"]:
        d = compose([f"dataset={option}"])["dataset"]
        assert d["name"] in DATASETS and d["recipe"] in RECIPES and d["grader"] in GRADERS
    for _, option in [o for o in OPTIONS if o[0] == "rollout"]:
        assert compose([f"rollout={option}"])["rollout"]["name"] in ENGINES
    for _, option in [o for o in OPTIONS if o[0] == "hardware"]:
        assert compose([f"hardware={option}"])["hardware"]["backend"] in BACKENDS
    # and the other way: every registered down-sampling rule is reachable from the CLI as algorithm.rule
    assert {"all", "max_variance", "max_reward", "random"} <= set(RULES.names())


def test_grpo_keeps_m_equal_to_n_under_override():
    cfg = compose(["algorithm=grpo", "algorithm.n=32"])
    assert cfg["algorithm"]["m"] == 32 and cfg["algorithm"]["rule"] == "all"


BAD = [
    (["algorithm.m=100"], "algorithm.m"),
    (["algorithm.m=0"], "algorithm.m"),
    (["algorithm.rule=best_of"], "algorithm.rule"),
    (["rollout.name=sglang"], "rollout.name"),
    (["dataset.name=nope"], "dataset.name"),
    (["dataset.recipe=nope"], "dataset.recipe"),
    (["algorithm=grpo_ga", "algorithm.n=10", "algorithm.m=3"], "algorithm.n"),
    (["algorithm=grpo", "algorithm.m=4"], "algorithm.m"),
    (["hardware.finetune=qlora"], "hardware.finetune"),
    (["optim.schedule=warmup_stable"], "optim.schedule"),
    (["model=qwen2_5_3b_instruct"], "model.path"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[k for _, k in BAD])
def test_bad_config_fails_before_any_model_load(overrides, key, monkeypatch):
    """``pods.config.validate``, what every caller of ``pods.loop.train`` runs first (it takes a validated Root only)."""
    import pods.models
    from pods.config import validate
    from pods.tasks import DATASETS

    def boom(*a, **k):
        raise AssertionError("a model or dataset was loaded before validation")

    monkeypatch.setattr(pods.models, "resolve_model_dir", boom)
    monkeypatch.setattr(DATASETS, "get", boom)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose(overrides))


def test_cli_bad_config_exits_2_fast_with_the_key():
    t = time.time()
    p = door("pods.train", ["algorithm.m=1000", "hydra.run.dir=/tmp/pods-bad"])  # in-process (support.doors)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "algorithm.m (1000) must be <= algorithm.n" in p.stderr
    assert "Traceback" not in p.stderr
    assert time.time() - t < 60


def test_validate_accepts_every_cpu_default():
    validate(shrink(compose()))
