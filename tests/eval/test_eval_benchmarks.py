"""Every benchmark config loads a tiny local file written in its hub copy's column layout (no network); suites compose."""

from __future__ import annotations

import json

import pytest

from pods.errors import ConfigError
from pods.eval.benchmarks import compose_suite, load_benchmark

# benchmark -> (two records in the hub copy's columns, the golds the loader must read out of them)
FIXTURES = {
    "gsm8k": ([{"question": "Q1", "answer": "so 7\n#### 1,200"}, {"question": "Q2", "answer": "#### -3"}], ["1200", "-3"]),
    "math500": (
        [
            {
                "problem": "P1",
                "solution": "\\boxed{\\frac{1}{2}}",
                "answer": "\\frac{1}{2}",
                "subject": "Algebra",
                "level": 2,
                "unique_id": "test/a/1.json",
            },
            {"problem": "P2", "solution": "...", "answer": "5", "subject": "Geometry", "level": 3, "unique_id": "test/b/2.json"},
        ],
        ["\\frac{1}{2}", "5"],
    ),
    "aime24": (
        [
            {"id": 60, "problem": "P1", "solution": "s", "answer": "204", "url": "u", "year": "2024"},
            {"id": 61, "problem": "P2", "solution": "s", "answer": "025", "url": "u", "year": "2024"},
        ],
        ["204", "025"],
    ),
    "aime25": ([{"problem": "P1", "answer": "70", "id": "0"}, {"problem": "P2", "answer": "588", "id": "1"}], ["70", "588"]),
    "amc23": (
        [{"id": 0, "question": "Q1", "answer": 27.0, "url": "u"}, {"id": 1, "question": "Q2", "answer": 0.5, "url": "u"}],
        ["27", "0.5"],
    ),
    "minerva_math": ([{"question": "Q1", "answer": "7.5e-3"}, {"question": "Q2", "answer": "\\frac{1}{3}"}], ["7.5e-3", "\\frac{1}{3}"]),
    "olympiadbench": (
        [
            {"id": 1606, "question": "Q1", "solution": ["s"], "final_answer": ["$\\frac{1}{2}$"], "unit": None, "answer_type": "Numerical"},
            {"id": 1607, "question": "Q2", "solution": ["s"], "final_answer": ["3", "4"], "unit": None, "answer_type": "Numerical"},
        ],
        ["\\frac{1}{2}", "3"],
    ),
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_benchmark_loads_its_hub_layout_from_local_files(name, tmp_path):
    records, golds = FIXTURES[name]
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    suite = compose_suite("d3s", [f"suite.benchmarks.{name}.files={path}"])
    examples = load_benchmark(suite.benchmarks[name], "boxed")
    assert [e.gold for e in examples] == golds
    question_column = suite.benchmarks[name].question
    assert examples[0].messages[-1]["content"].startswith(records[0][question_column] + "\n")  # the boxed prompt's user turn
    assert "\\boxed{}" in examples[0].messages[-1]["content"]
    id_column = suite.benchmarks[name].id
    assert examples[1].id == (str(records[1][id_column]) if id_column else f"{name}/1")


def test_suites_name_the_papers_benchmarks_and_settings():
    d3s = compose_suite("d3s")
    assert sorted(d3s.benchmarks) == ["aime24", "aime25", "amc23", "gsm8k", "math500", "minerva_math", "olympiadbench"]
    assert (d3s.samples, d3s.ks, d3s.prompt) == (32, [1, 8], "boxed")  # D3S Table 1: Pass@1 / Pass@8 of 32 generations
    sparse = compose_suite("sparse_rl")
    # lsjia/Sparse-RL evaluation/simplelr_math_eval: T 0.8, top_p 0.95, 8192 tokens, 1 sample; aime24/amc23 32 x 16384
    assert (sparse.temperature, sparse.top_p, sparse.max_tokens, sparse.samples) == (0.8, 0.95, 8192, 1)
    assert sparse.per_benchmark["aime24"] == {"samples": 32, "max_tokens": 16384}
    pods = compose_suite("pods")
    assert sorted(pods.benchmarks) == ["gsm8k", "math500"] and (pods.grader, pods.samples, pods.temperature) == ("lenient", 5, 0.9)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["suite.ks=[1,64]"], "k = 64 > samples = 32"),
        (["suite.only=[math]"], "unknown benchmark 'math'"),
        (["suite.grader=nope"], "unknown grader 'nope'"),
        (["suite.prompt=nope"], "unknown prompt format 'nope'"),
        (["suite.benchmarks.gsm8k.gold=nope"], "unknown gold format 'nope'"),
    ],
)
def test_bad_suite_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        compose_suite("d3s", overrides)
    assert "\n" not in str(e.value)
