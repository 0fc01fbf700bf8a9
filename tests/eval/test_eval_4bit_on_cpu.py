"""``pods-eval`` of a run trained over a 4-bit base evaluates the adapter over that base, as the run trained it (and as
``pods-export`` merges it), not over the bf16 base: ``quantized`` reaches the loader, on the HF engine's path and on
the path that writes plain weights for an engine that loads its own (vLLM); without a CUDA device the command
refuses in one line before a model loads.

A mock, for what needs a GPU only: ``pods.eval.run.has_cuda`` says yes and ``pods.models.load_policy`` (bitsandbytes'
NF4 loading, CUDA only) records what it was asked and returns the float32 base on the CPU. The run itself is a real
tiny LoRA run whose ``config.json`` then says ``model.quantization: 4bit`` (a CPU cannot train one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.doors import door
from support.runs import train_run

SUITE = ["--suite", "toy", "suite.only=[toy_arith]", "suite.benchmarks.toy_arith.size=4", "suite.samples=1", "suite.max_tokens=8"]


@pytest.fixture(scope="module")
def run_4bit(tmp_path_factory) -> Path:
    run = train_run(tmp_path_factory.mktemp("eval4bit") / "run", "lora", ["train.max_steps=1", "train.checkpoint_every_steps=null"])
    cfg = json.loads((run / "config.json").read_text())
    cfg["model"]["quantization"] = "4bit"
    (run / "config.json").write_text(json.dumps(cfg))
    return run


@pytest.fixture
def nf4_loader(monkeypatch) -> list:
    """``load_policy`` as the 4-bit loader is asked (its arguments recorded), the float32 base returned on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    import pods.eval.run
    import pods.models

    asked = []

    def load_policy(model_dir, hw, quantization=None, **kwargs):
        asked.append((quantization, hw.device))
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    monkeypatch.setattr(pods.eval.run, "has_cuda", lambda: True)
    monkeypatch.setattr(pods.models, "load_policy", load_policy)
    return asked


def test_pods_eval_loads_the_4bit_base_a_run_trained_on(run_4bit, nf4_loader, tmp_path):
    p = door("pods.eval", [str(run_4bit), *SUITE, "--device", "cuda", "--dtype", "bfloat16", "--out", str(tmp_path)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert nf4_loader == [("4bit", "cuda")]  # before the fix: the bf16 base, loaded plain (and moved to a GPU)
    assert (tmp_path / "eval" / "toy" / "summary.json").is_file()


def test_the_weights_written_for_vllm_are_merged_over_the_4bit_base(run_4bit, nf4_loader, tmp_path):
    from pods.eval.merge import engine_dir
    from pods.eval.weights import resolve
    from pods.models import load_tokenizer

    target = resolve(str(run_4bit))
    with engine_dir(target, "bfloat16", load_tokenizer(target.base), tmp_path / "out") as d:
        assert (Path(d) / "config.json").is_file()
    assert nf4_loader == [("4bit", "cuda")]


def test_a_4bit_run_without_a_gpu_is_refused_in_one_line(run_4bit, tmp_path):
    p = door("pods.eval", [str(run_4bit), *SUITE, "--device", "cpu", "--out", str(tmp_path)])
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("pods-eval: ") and "trained on a 4-bit base" in p.stderr
    assert "--device is cpu" in p.stderr and not (tmp_path / "eval").exists()
