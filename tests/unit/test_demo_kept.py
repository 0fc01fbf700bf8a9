"""A finished run is kept by ``make demo`` / ``make reproduce-figure-cpu`` only while its config is what the
experiment file composes now: a changed budget is refused in one line instead of silently mixing old and new runs."""

import json

import pytest

from pods.compose import compose
from pods.demo import differences, job
from pods.errors import ConfigError

ARGS = ["experiment=toy_grpo_16_16_cpu", "seed=4", "train.checkpoint_at_end=false"]


def finished_run(tmp_path, overrides=()):
    run = tmp_path / "seed4"
    run.mkdir()
    cfg = json.loads(json.dumps(compose([*ARGS, *overrides], rules=False).model_dump()))
    (run / "config.json").write_text(json.dumps({**cfg, "provenance": {"model": "x"}}))
    (run / "launch.json").write_text(json.dumps({"status": "finished"}))
    return run


def test_a_finished_run_with_the_same_config_is_kept(tmp_path, capsys):
    assert job("GRPO", "toy_grpo_16_16_cpu", 4, finished_run(tmp_path), "false", []) is None
    assert "kept" in capsys.readouterr().out


def test_a_finished_run_with_another_budget_is_refused_naming_the_key(tmp_path):
    run = finished_run(tmp_path, ["train.max_steps=7"])
    with pytest.raises(ConfigError, match=r"train\.max_steps.*move or delete"):
        job("GRPO", "toy_grpo_16_16_cpu", 4, run, "false", [])
    assert (run / "config.json").exists()  # nothing of the finished run is deleted


def test_an_option_added_since_the_run_is_not_a_difference():
    kept = {"train": {"max_steps": 5}, "seed": 1}
    assert differences(kept, {"train": {"max_steps": 5, "new_knob": 0}, "seed": 1}) == []
    assert differences(kept, {"train": {"max_steps": 6}, "seed": 2}) == ["train.max_steps", "seed"]


def test_the_command_stops_in_one_line_before_any_run_starts(tmp_path):
    from support.doors import door

    runs = tmp_path / "out" / "runs" / "toy_grpo_16_16_cpu"
    runs.mkdir(parents=True)
    finished_run(runs, ["train.max_steps=7"])
    r = door("pods.demo", ["reproduce", "--out", tmp_path / "out", "--seeds", "4"])  # python -m pods.demo, in-process
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().count("\n") == 0 and "train.max_steps" in r.stderr
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == ["toy_grpo_16_16_cpu"]  # no other arm started
