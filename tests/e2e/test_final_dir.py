"""A run's ``final/`` is a complete model directory (issue 35, case 6): weights, tokenizer and chat template; a LoRA
run's final/ names the base it goes over. ``pods-eval RUN/final`` works through the command line, for a full run and
a LoRA run, and from a copy of final/ outside its run."""

from __future__ import annotations

import json
import shutil

import pytest

from support.doors import door

ONE_STEP = [
    "algorithm.n=8",
    "algorithm.m=4",
    "train.max_steps=1",
    "train.time_budget_s=null",
    "eval.max_examples=8",
    "eval.repeats=1",
    "eval.every_s=null",
    "train.prompts_per_step=1",
    "train.checkpoint_at_end=weights",
]
TOY = ["--suite", "toy", "suite.only=[toy_arith]", "suite.benchmarks.toy_arith.size=8", "suite.samples=1", "suite.max_tokens=16"]


def run(args):
    """``python -m MODULE ARGS``, in-process (``support.doors``)."""
    return door(args[1], args[2:])


def completions(out) -> list[str]:
    return [json.loads(line)["completion"] for line in (out / "eval" / "toy" / "samples.jsonl").open()]


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_final_is_a_model_directory_that_pods_eval_evaluates(tiny_dir, tmp_path, finetune):
    run_dir = tmp_path / "run"
    p = run(["-m", "pods.train", *ONE_STEP, f"hardware.finetune={finetune}", f"hydra.run.dir={run_dir}"])
    assert p.returncode == 0, p.stderr[-3000:]
    final = run_dir / "final"
    assert (final / "tokenizer.json").is_file() and (final / "tokenizer_config.json").is_file()
    assert (final / "chat_template.jinja").is_file() or "chat_template" in json.loads((final / "tokenizer_config.json").read_text())
    note = json.loads((final / "pods_final.json").read_text())
    if finetune == "lora":
        adapter = json.loads((final / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == note["base_model"] == str(tiny_dir)
    else:
        assert note["weights"] == "full" and (final / "config.json").is_file()

    p = run(["-m", "pods.eval", str(final), *TOY])  # out: the run directory (final/ knows its run)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| toy_arith | 8 | 1 |" in p.stdout
    assert json.loads((run_dir / "eval" / "toy" / "config.json").read_text())["weights"] == str(final)
    p = run(["-m", "pods.eval", str(run_dir), *TOY, "--out", str(tmp_path / "by_run")])  # the run: its base's tokenizer
    assert p.returncode == 0, p.stderr[-3000:]
    assert completions(run_dir) == completions(tmp_path / "by_run")  # final/'s tokenizer and template are the run's

    alone = tmp_path / "copied"
    shutil.copytree(final, alone)  # out of its run: a model directory on its own (a LoRA adapter finds its base)
    p = run(["-m", "pods.eval", str(alone), *TOY, "--out", str(tmp_path / "alone")])
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(completions(tmp_path / "alone")) == 8
