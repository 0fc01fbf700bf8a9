"""Every bad input to ``python -m pods.train`` stops at once: exit code 2, ONE line on stderr naming the key and the
valid values, nothing loaded (the training loop is never entered) and no run directory left behind.

The table runs through the CLI's entry point (``pods.train:main``, what ``pods-train`` calls) in this process, one
row after another, so it stays fast; ``test_real_processes`` runs a few rows as real ``python -m pods.train``
processes to show that the in-process entry is the same thing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_CUDA = not __import__("torch").cuda.is_available()

# (overrides, what the one line must contain); every line also starts with "pods: config error: "
TABLE = [
    # wrong types
    (["optim.lr=abc"], "optim.lr must be a number, got 'abc'"),
    (["optim.lr=[1,2]"], "optim.lr must be a number"),
    (["algorithm.n=1.5"], "algorithm.n must be an integer, got 1.5"),
    (["algorithm.n=abc"], "algorithm.n must be an integer"),
    (["train.save_final=maybe"], "train.save_final"),
    # out of range
    (["eval.every_s=-5"], "eval.every_s must be > 0 (or null), got -5"),
    (["sampling.max_tokens=0"], "sampling.max_tokens must be >= 1, got 0"),
    (["sampling.temperature=0"], "sampling.temperature must be > 0"),
    (["sampling.top_p=1.5"], "sampling.top_p must be <= 1"),
    (["train.max_steps=0"], "train.max_steps must be >= 1 (or null)"),
    (["train.keep_checkpoints=0"], "train.keep_checkpoints must be >= 1 (or null)"),
    (["optim.warmup_ratio=1.5"], "optim.warmup_ratio must be < 1"),
    (["optim.betas=[0.9]"], "optim.betas must have 2 items"),
    (["hardware.lora.r=0"], "hardware.lora.r must be >= 1"),
    (["train.max_steps=null", "train.time_budget_s=null"], "set train.max_steps or train.time_budget_s"),
    # a value outside a closed set
    (["train.checkpoint_at_end=maybe"], "train.checkpoint_at_end must be one of 'full', 'weights' or False"),
    (["hardware.dtype=fp16"], "hardware.dtype must be one of 'float32', 'bfloat16' or 'float16', got 'fp16'"),
    (["hardware.device=gpu"], "hardware.device must be one of 'cpu' or 'cuda'"),
    (["logger=wandb", "logger.mode=on"], "logger.mode must be one of 'online', 'offline' or 'disabled'"),
    # unknown keys: the closest valid one is named
    (["optim.lrr=0.1"], "optim.lrr: unknown key; did you mean 'optim.lr'?"),
    (["+optim.lrr=0.1"], "optim.lrr: unknown key; did you mean 'optim.lr'?"),
    (["algorithm.rulee=random"], "algorithm.rulee: unknown key; did you mean 'algorithm.rule'?"),
    (["+seedd=3"], "seedd: unknown key; did you mean 'seed'?"),
    (["sampling.maxtokens=8"], "did you mean 'sampling.max_tokens'?"),
    # unknown group options and registry names
    (["algorithm=nope"], "algorithm: unknown option 'nope'; valid: d3s, d3s_cross, grpo,"),
    (["experiment=nope"], "experiment: unknown option 'nope'; valid:"),
    (["hardware=h100"], "hardware: unknown option 'h100'; did you mean"),
    (["rollout=sglang"], "rollout: unknown option 'sglang'; valid: hf,"),
    (["algorithm.rule=nope"], "algorithm.rule: unknown downsample rule 'nope'; valid: all,"),
    (["algorithm.token_rule=nope"], "algorithm.token_rule: unknown"),
    (["optim.schedule=nope"], "optim.schedule: unknown"),
    (["dataset.grader=nope"], "dataset.grader: unknown"),
    # cross-field rules
    (["algorithm.m=100"], "algorithm.m (100) must be <= algorithm.n (64)"),
    (["algorithm=grpo_ga", "algorithm.n=64", "algorithm.m=24"], "algorithm.n (64) must be divisible by algorithm.m (24)"),
    (["rollout=vllm", "rollout.max_model_len=64"], "rollout.max_model_len (64) < dataset.max_prompt_length"),
    (["hardware=cpu_ddp2_zero3"], "hardware.nproc_per_node=2 (cpu_ddp2_zero3) needs one process per GPU"),
    # missing local files
    (
        ["dataset=gsm8k", "dataset.train_files=/nonexistent/train.jsonl", "dataset.test_files=/nonexistent/test.jsonl"],
        "dataset.train_files: file not found: /nonexistent/train.jsonl",
    ),
    (["model=qwen2_5_3b_instruct", "model.path=/nonexistent/model"], "model.path"),
    (["train.resume=/nonexistent/step_000001.pt"], "train.resume: file not found"),
    # hub ids while offline (the tests run with HF_HUB_OFFLINE=1)
    (["dataset=gsm8k"], "dataset.train_hub: hub dataset 'openai/gsm8k' while offline"),
    (["dataset=math500"], "dataset.test_hub: hub dataset 'HuggingFaceH4/MATH-500' while offline"),
    (["model=qwen2_5_3b_instruct"], "model.path 'Qwen/Qwen2.5-3B-Instruct' is a hub id"),
    # what this machine cannot run (a CPU)
    pytest.param(
        ["hardware.dtype=float16"],
        "hardware.dtype=float16 needs a CUDA device",
        marks=pytest.mark.skipif(not NO_CUDA, reason="a GPU is here"),
    ),
    pytest.param(
        ["hardware.device=cuda"],
        "hardware.device=cuda (hardware=cpu) but no CUDA device",
        marks=pytest.mark.skipif(not NO_CUDA, reason="a GPU is here"),
    ),
    pytest.param(
        ["hardware=l40s_lora"],
        "hardware.device=cuda (hardware=l40s_lora) but no CUDA device",
        marks=pytest.mark.skipif(not NO_CUDA, reason="a GPU is here"),
    ),
    pytest.param(
        ["optim.name=adamw_8bit"],
        "optim.name=adamw_8bit (bitsandbytes) needs a CUDA device",
        marks=pytest.mark.skipif(not NO_CUDA, reason="a GPU is here"),
    ),
    (["model.quantization=4bit", "hardware.finetune=lora"], "model.quantization=4bit needs bitsandbytes on a CUDA device"),
    pytest.param(
        ["rollout=vllm", "rollout.enable_sleep_mode=true"],
        "rollout.enable_sleep_mode=true needs a CUDA device",
        marks=pytest.mark.skipif(not NO_CUDA, reason="a GPU is here"),
    ),
    # a malformed override
    (["optim.lr=[0.1"], "optim.lr=[0.1"),
]


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Call the CLI entry point with ``argv`` in an empty directory; the training loop must never be entered."""
    import pods.loop
    import pods.train

    def entered(*args, **kwargs):
        raise AssertionError("the training loop was entered: the bad input was not caught before loading")

    monkeypatch.setattr(pods.loop, "train", entered)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def run(argv: list[str]) -> tuple[int, str]:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["pods-train", *argv])
        with pytest.raises(SystemExit) as exit_:
            pods.train.main()
        return exit_.value.code, capsys.readouterr().err

    return run


@pytest.mark.parametrize(("overrides", "expected"), TABLE, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, overrides, expected):
    code, err = cli(overrides)
    lines = err.strip().splitlines()
    assert code == 2, err[-2000:]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith("pods: config error: ") and expected in lines[0], lines[0]
    assert not any(tmp_path.iterdir()), f"left behind: {list(tmp_path.iterdir())}"


def test_multirun_checks_every_job_before_launching(cli, tmp_path):
    """A sweep with one bad combination (m = 32 > n = 16) fails before any job starts."""
    code, err = cli(["-m", "algorithm.n=16,64", "algorithm.m=16,32"])
    assert code == 2 and err.strip().splitlines() == [err.strip()], err[-2000:]
    assert "algorithm.m (32) must be <= algorithm.n (16)" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # 3 interpreters at ~8 s of imports each; the cases above are the same rows in-process
def test_real_processes(tmp_path):
    """The same rows as real ``python -m pods.train`` processes (started together: the imports dominate)."""
    rows = [TABLE[0], TABLE[5], TABLE[20]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pods.train", *ov], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for ov, _ in rows
    ]
    for p, (ov, expected) in zip(procs, rows):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 2, (ov, err[-2000:])
        assert (
            err.strip().splitlines() == [f"pods: config error: {err.strip().removeprefix('pods: config error: ')}"] and expected in err
        ), err
    assert not any(tmp_path.iterdir())
