"""D3S's outcome ablation through its command (``make reproduce FIG=d3s-outcome-cpu`` = ``python -m pods.results.d3s_outcome
reproduce``) on a seconds-long budget: GRPO and across-groups selection, one seed, through ``python -m pods.train``,
copied and summarised (band metric by steps and tokens, paired differences, the registered predictions); and the
probe of the shipped starting model on a few prompts."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from support.config import ROOT
from support.harness import worker_env

pytestmark = pytest.mark.slow
TINY = ["train.max_steps=2", "train.prompts_per_step=4", "eval.max_examples=4", "eval.every_steps=1", "sampling.max_tokens=16"]


def test_reproduce_runs_two_arms_and_summarizes(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    cmd = [sys.executable, "-m", "pods.results.d3s_outcome", "reproduce", "--seeds", "1", "--arms", "grpo", "cross"]
    subprocess.run(
        cmd + ["--out", str(out), "--runs", str(runs), *TINY], cwd=ROOT, env=worker_env(), check=True, timeout=900, capture_output=True
    )
    table = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["arm"], r["seed"], r["steps"]) for r in table] == [("grpo", "1", "2"), ("cross", "1", "2")]
    grpo, cross = table
    assert int(cross["tokens_trained"]) < int(grpo["tokens_trained"])  # across groups trains on half the rollouts
    bands = json.loads((out / "bands.json").read_text())
    assert {(b["arm"], b["x"], b["y"]) for b in bands} == {("cross", x, y) for x in ("step", "tokens") for y in ("accuracy", "answer_prob")}
    pred = json.loads((out / "predictions.json").read_text())
    assert [p["prediction"][0] for p in pred] == ["a", "b", "c", "e"] and all("informative" in p for p in pred[1:])
    assert len(list(csv.DictReader((out / "paired.csv").open()))) == 2  # accuracy and answer_prob, seed 1


def test_probe_measures_every_term_count_of_the_shipped_model(tmp_path):
    cmd = [sys.executable, "-m", "pods.results.d3s_outcome", "probe", "--prompts", "2", "--out", str(tmp_path)]
    subprocess.run(cmd, cwd=ROOT, env=worker_env(), check=True, timeout=600, capture_output=True)
    rec = json.loads((tmp_path / "probe.jsonl").read_text().splitlines()[-1])
    assert rec["model"] == "tiny-181f2e0d2e28" and sorted(rec["per_terms"]) == ["2", "3", "4", "5"]
    assert all(r["prompts"] == 2 and 0 <= r["sampled"] <= 1 for r in rec["per_terms"].values()) and set(rec["gate"]) == {
        "greedy",
        "sampled",
        "zero_var",
    }
