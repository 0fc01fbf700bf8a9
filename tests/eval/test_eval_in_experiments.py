"""The follow-up papers' experiments evaluate as their papers did, at the end of the run: the D3S files the `d3s`
suite (7 benchmarks, 32 samples, Pass@1 and Pass@8), the released Sparse-RL recipe the `sparse_rl` suite with a
dense engine and the released evaluation settings. Values typed in from the papers and the released scripts."""

from __future__ import annotations

import pytest

from pods.config import ConfigError, validate
from pods.eval.benchmarks import compose_suite
from support.config import CONF, compose

D3S = sorted(p.stem for p in (CONF / "experiment").glob("d3s_*_h100x8.yaml"))
SPARSE = sorted(p.stem for p in (CONF / "experiment").glob("sparse_rl_qwen2_5_3b_*.yaml"))


@pytest.mark.parametrize("experiment", D3S)
def test_d3s_experiments_end_with_the_papers_table(experiment):
    ev = compose([f"experiment={experiment}"])["eval"]
    assert ev["suite"] == "d3s" and ev["suite_engine"] in ("hf", "vllm")
    suite = compose_suite("d3s", ev["suite_overrides"])
    assert sorted(suite.benchmarks) == ["aime24", "aime25", "amc23", "gsm8k", "math500", "minerva_math", "olympiadbench"]
    assert suite.samples == 32 and list(suite.ks) == [1, 8]


@pytest.mark.parametrize("experiment", SPARSE)
def test_sparse_rl_recipe_evaluates_densely_as_released(experiment):
    cfg = compose([f"experiment={experiment}"])
    ev = cfg["eval"]
    assert ev["suite"] == "sparse_rl" and ev["suite_engine"] in ("hf", "vllm")  # dense, whatever engine trained
    suite = compose_suite("sparse_rl", ev["suite_overrides"])
    assert (suite.temperature, suite.top_p, suite.max_tokens, suite.samples, suite.prompt) == (0.8, 0.95, 8192, 1, "boxed")


def test_an_unknown_suite_is_refused_before_the_run():
    with pytest.raises(ConfigError, match="eval.suite: unknown suite 'd3z'; valid: .*d3s"):
        validate(compose(["eval.suite=d3z"]))
