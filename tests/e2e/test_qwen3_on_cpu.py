"""The tiny Qwen3 (q/k norms, Qwen3's thinking switch in its chat template) through the commands a user types:
``python -m pods.train model=tiny_qwen3`` with the HF engine (in-process), its prompts rendered with thinking off,
the switch recorded in config.json and final/, and ``pods-eval`` on a copy of final/ rendering its prompts the same
way. The vLLM-CPU run: tests/vllm_cpu/test_qwen3_vllm_on_cpu.py."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file

from pods.metrics import read_metrics
from support.config import compose, shrink
from support.doors import door

OFF = {"enable_thinking": False}
SHORT = [
    "algorithm.n=8",
    "algorithm.m=4",
    "train.max_steps=2",
    "train.time_budget_s=null",
    "train.prompts_per_step=1",
    "eval.max_examples=8",
    "eval.repeats=1",
    "eval.every_s=null",
]
TOY = ["--suite", "toy", "suite.only=[toy_arith]", "suite.benchmarks.toy_arith.size=4"]


def test_the_loop_renders_its_prompts_with_the_models_template_kwargs(tmp_path):
    """Every training and test prompt of a ``model=tiny_qwen3`` run ends with the empty think block."""
    from pods.config import validate
    from pods.loop.run import Run

    run = Run(validate(shrink(compose(["model=tiny_qwen3"]))), tmp_path)
    think = run.tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert run.tok.convert_tokens_to_ids("</think>") in think and len(run.train_ids) > 1000
    assert all(ids[-len(think) :] == think for ids in run.train_ids)


def test_tiny_qwen3_trains_through_the_cli_and_pods_eval_keeps_thinking_off(tmp_path):
    from pods.tiny import ASSETS

    run = tmp_path / "run"
    p = door("pods.train", ["model=tiny_qwen3", *SHORT, "train.save_final=true", f"hydra.run.dir={run}"])
    assert p.returncode == 0, p.stderr[-3000:]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"]["chat_template_kwargs"] == OFF and cfg["provenance"]["model"]["shipped"] is True
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "train")] == [1, 2]
    final = run / "final"
    assert json.loads((final / "config.json").read_text())["model_type"] == "qwen3"
    assert json.loads((final / "pods_final.json").read_text())["chat_template_kwargs"] == OFF
    shipped = load_file(ASSETS / cfg["provenance"]["model"]["asset"] / "model.safetensors")
    trained = load_file(final / "model.safetensors")
    assert max((trained[k] - shipped[k]).abs().max().item() for k in shipped) > 0
    assert any(".q_norm." in k for k in trained)

    moved = shutil.copytree(final, tmp_path / "elsewhere" / "model")  # final/ alone: its pods_final.json says how
    e = door("pods.eval", [str(moved), *TOY, "--out", str(tmp_path / "e1")])
    assert e.returncode == 0, e.stderr[-3000:]
    assert json.loads((tmp_path / "e1" / "eval" / "toy" / "config.json").read_text())["chat_template_kwargs"] == OFF
    e = door("pods.eval", [str(moved), *TOY, "suite.chat_template_kwargs={}", "--out", str(tmp_path / "e2")])
    assert e.returncode == 0, e.stderr[-3000:]
    assert json.loads((tmp_path / "e2" / "eval" / "toy" / "config.json").read_text())["chat_template_kwargs"] == {}


@pytest.mark.slow  # about 1-3 min of training: make test-all
def test_tiny_qwen3_learns_the_toy_task_with_pods(tmp_path):
    """The CPU comparison's PODS arm (64 -> 16, max variance) on the tiny Qwen3 instead of the tiny Qwen2, 40 steps:
    sampled test accuracy rises by more than 0.15 (fixed before the run; measured once at seed 1: 0.21 at step 0,
    0.44 at 20, 0.58 at 40, 0.65 at 60)."""
    run = tmp_path / "run"
    args = ["experiment=toy_pods_64_16_cpu", "model=tiny_qwen3", "seed=1", "train.max_steps=40", "eval.every_steps=40"]
    p = door("pods.train", [*args, f"hydra.run.dir={run}"])
    assert p.returncode == 0, p.stderr[-3000:]
    acc = {r["step"]: r["accuracy"] for r in read_metrics(run / "metrics.jsonl", "eval")}
    assert sorted(acc) == [0, 40] and acc[40] > acc[0] + 0.15, acc
