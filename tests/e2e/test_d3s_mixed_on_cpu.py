"""The D3S ablation's command (``make reproduce-d3s-mixed-cpu`` = ``python -m pods.results.d3s_mixed reproduce``) on a
seconds-long budget: full D3S (the arm with every piece: cross-group samples, tokens, schedule) through
``python -m pods.train``, its copy and the summary; a second call keeps the finished run. The other arm files compose
and validate in tests/unit/test_d3s_mixed.py."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from support.config import ROOT
from support.doors import door
from support.harness import worker_env

pytestmark = pytest.mark.slow
TINY = ["train.max_steps=2", "train.prompts_per_step=4", "eval.max_examples=4", "sampling.max_tokens=16"]


def test_reproduce_runs_each_arm_once_and_summarizes(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    cmd = [sys.executable, "-m", "pods.results.d3s_mixed", "reproduce", "--seeds", "1", "--arms", "full"]
    cmd += ["--out", str(out), "--runs", str(runs), *TINY]
    subprocess.run(cmd, cwd=ROOT, env=worker_env(), check=True, timeout=600, capture_output=True)
    table = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["arm"], r["seed"], r["steps"]) for r in table] == [("full", "1", "2")]
    full = table[0]
    assert float(full["entropy_kept"]) > 0 and float(full["kept_per_step"]) < 4 * 8  # 4 x N(p) of 32 rows kept
    rows = [json.loads(line) for line in (out / "runs" / "full_s1" / "metrics.jsonl").open()]
    step = next(r for r in rows if r["kind"] == "train")
    assert sum(v[0] for v in step["strata"].values()) == 4 and sum(v[2] for v in step["strata"].values()) == step["kept"]
    assert {r["arm"] for r in csv.DictReader((out / "strata.csv").open())} == {"full"}
    assert json.loads((out / "predictions.json").read_text())[0]["prediction"].startswith("d1: full")
    assert (out / "accuracy.png").stat().st_size > 0
    started = (out / "load.txt").read_text().count("start")
    again = door("pods.results.d3s_mixed", cmd[3:], env={"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None})  # in-process
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "load.txt").read_text().count("start") == started == 1  # nothing reran
