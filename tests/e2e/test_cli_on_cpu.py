"""The user-facing commands, run as a user would: `python -m pods.train` (single and multirun, with the end-of-run
suite) and the demo. The fast tier runs them in-process through their ``main(argv)`` (``support.doors``); the slow
tests launch the real processes (the multirun: ``pods.train``'s; the demo: ``pods.demo``'s, whose runs are processes
of their own)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from pods.metrics import read_metrics
from support.config import ROOT
from support.doors import Ran, door

SHORT = [
    "train.max_steps=2",
    "train.time_budget_s=null",
    "eval.max_examples=8",
    "eval.repeats=1",
    "eval.every_s=null",
    "train.prompts_per_step=1",
]


def run(args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600, **kw)


def train(args: list[str]) -> Ran:
    """``python -m pods.train ARGS``, in-process."""
    return door("pods.train", args)


def test_train_cli_writes_config_and_metrics(tiny_dir, tmp_path):
    p = train(["algorithm=grpo_ga", "algorithm.n=8", "algorithm.m=4", *SHORT, f"hydra.run.dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "config.json").exists() and (tmp_path / ".hydra" / "overrides.yaml").exists()
    assert len(read_metrics(tmp_path / "metrics.jsonl", "train")) == 2
    log = (tmp_path / "train.log").read_text()  # the run's log (pods.log via Hydra), with times and levels
    assert f"run directory: {tmp_path}" in log and "[pods]" in log and f"[pods] run directory: {tmp_path}" in p.stdout
    assert json.loads((tmp_path / "config.json").read_text())["train"]["keep_checkpoints"] is None  # the schema's default, written out


TOY_SUITE = ["eval.suite=toy", "eval.suite_overrides=['suite.only=[toy_arith]','suite.benchmarks.toy_arith.size=4','suite.samples=2']"]


def test_train_with_eval_suite_evaluates_the_final_weights_at_the_end(tiny_dir, tmp_path):
    """The end-of-run suite composes inside the training's Hydra app (it used to exit 1 there: "GlobalHydra is already
    initialized") and writes <run_dir>/eval/toy/ from final/."""
    args = ["algorithm.n=8", "algorithm.m=4", *SHORT, *TOY_SUITE, "train.checkpoint_at_end=weights"]
    p = train([*args, f"hydra.run.dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-3000:]
    out = tmp_path / "eval" / "toy"
    summary = json.loads((out / "summary.json").read_text())
    m = summary["benchmarks"]["toy_arith"]
    assert list(summary["benchmarks"]) == ["toy_arith"] and (m["problems"], m["samples"], m["grader"]) == (4, 2, "toy")
    assert 0.0 <= m["avg@n"] <= m["pass@k"]["2"] <= 1.0 and 0 < m["mean_tokens"] <= 24  # the toy suite's max_tokens
    assert summary["weights"] == str(tmp_path / "final") and len((out / "samples.jsonl").read_text().splitlines()) == 4 * 2
    assert "| toy_arith | 4 | 2 |" in p.stdout


@pytest.mark.parametrize(
    "suite,message",
    [
        (["eval.suite=nope"], "eval.suite: unknown suite 'nope'"),
        (["eval.suite=toy", "eval.suite_overrides=['suite.samples=0']"], "suite.samples must be >= 1"),
        (["eval.suite=toy", "eval.suite_overrides=['suite.sample=2']"], "did you mean 'suite.samples'?"),
        (["eval.suite=toy", "eval.suite_overrides=['suite.only=[gsm8k]']"], "unknown benchmark 'gsm8k'"),
    ],
)
def test_a_bad_eval_suite_fails_in_one_line_before_the_run(tmp_path, suite, message):
    p = train([*suite, "train.checkpoint_at_end=weights", f"hydra.run.dir={tmp_path / 'run'}"])
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr[-3000:]
    assert not (tmp_path / "run").exists()  # refused before Hydra made the run directory, so before any model loaded


@pytest.mark.slow
def test_multirun_sweeps_the_rule(tiny_dir, tmp_path):
    p = run(
        [
            "-m",
            "pods.train",
            "-m",
            "algorithm.n=8",
            "algorithm.m=4",
            "algorithm.rule=max_variance,random",
            *SHORT,
            f"hydra.sweep.dir={tmp_path}",
        ]
    )
    assert p.returncode == 0, p.stderr[-3000:]
    runs = sorted(d for d in tmp_path.iterdir() if (d / "metrics.jsonl").exists())
    assert len(runs) == 2
    rules = {__import__("json").loads((d / "config.json").read_text())["algorithm"]["rule"] for d in runs}
    assert rules == {"max_variance", "random"}


@pytest.mark.slow
def test_wandb_offline_logger_writes_a_run(tiny_dir, tmp_path):
    p = run(
        ["-m", "pods.train", "logger=wandb", "logger.mode=offline", "algorithm.n=4", "algorithm.m=2", *SHORT, f"hydra.run.dir={tmp_path}"]
    )
    assert p.returncode == 0, p.stderr[-3000:]
    offline = list((tmp_path / "wandb").glob("offline-run-*"))
    assert offline and list(offline[0].glob("*.wandb"))


@pytest.mark.slow
def test_demo_writes_figure_csv_and_band_summary_and_keeps_weights_for_pods_eval(tiny_dir, tmp_path):
    """``python -m pods.demo``: GRPO-GA and PODS x 3 seeds and GRPO 16/16 x 1, shrunk to 4 steps each; the CSV holds
    every evaluation of the runs' own metrics (answer_prob too), the summary the band metric per seed pair and
    pooled, and every run keeps final/ so that ``pods-eval RUN_DIR --suite toy`` works on it."""
    small = ["train.max_steps=4", "eval.every_steps=2", "eval.max_examples=8", "eval.repeats=1"]
    p = run(["-m", "pods.demo", "--out", str(tmp_path), *small])
    assert p.returncode == 0, p.stderr[-3000:]
    png, csv_path = tmp_path / "accuracy_vs_time.png", tmp_path / "accuracy_vs_time.csv"
    assert png.stat().st_size > 5000
    lines = csv_path.read_text().splitlines()
    dirs = sorted((tmp_path / "runs").glob("*/seed*"))
    assert len(dirs) == 7 and all((d / "final" / "config.json").is_file() for d in dirs)
    evals = sum(len(read_metrics(d / "metrics.jsonl", "eval")) for d in dirs)
    assert len(lines) - 1 == evals == 7 * 3  # steps 0, 2, 4: every CSV row is an eval row of the arms' own metrics
    assert all(row.split(",")[5] for row in lines[1:])  # answer_prob at every evaluation
    assert {"GRPO 16/16", "GRPO-GA 64/16", "PODS 64→16"} == {line.split(",")[0] for line in lines[1:]}
    summary = (tmp_path / "summary.txt").read_text()
    for x in ("time", "step"):
        band = re.search(
            rf"PODS 64→16 vs GRPO-GA 64/16 by {x}, band on sampled accuracy .*per seed pair (\S+x \S+x \S+x); pooled \d+\.\d\dx", summary
        )
        assert band, summary
        assert f"PODS 64→16 vs GRPO-GA 64/16 by {x}, 99% of peak (sampled accuracy)" in summary
    assert "load average" in summary and "CPU caveat (GRPO 16/16, context)" in summary
    assert "load average" in (tmp_path / "load.txt").read_text()
    pods_run = tmp_path / "runs" / "demo_pods_cpu" / "seed0"
    e = door(  # in-process; the real process of pods.eval: tests/eval/test_eval_doors.py's offline hub case
        "pods.eval",
        [
            str(pods_run),
            "--suite",
            "toy",
            "suite.samples=1",
            "suite.benchmarks.toy_arith.size=4",
            "suite.only=[toy_arith]",
        ],
    )
    assert e.returncode == 0, e.stderr[-3000:]
    assert (pods_run / "eval" / "toy" / "summary.json").is_file()
