"""pods-eval end to end on the tiny model (HF engine, CPU): a toy suite of two toy benchmarks, several samples; the
written samples are re-scored here independently and must reproduce summary.json; a LoRA run directory evaluates its
adapter; bad input is one line and exit code 2 before a model loads."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pods.eval.cli import main
from pods.tasks.toy import grade_toy
from support.doors import door
from support.harness import needs_vllm_kernels

SMALL = ["suite.benchmarks.toy_arith.size=4", "suite.benchmarks.toy_long.size=3", "suite.max_tokens=16"]


def rescore(rows: list[dict], k: int) -> tuple[float, float]:
    """(avg@n, pass@k) of one benchmark from its sample rows, by the toy grader and k-subset enumeration."""
    by_problem: dict[str, list[bool]] = {}
    for r in rows:
        by_problem.setdefault(r["problem_id"], []).append(grade_toy(r["completion"], r["gold"])[0])
    avg = sum(sum(c) / len(c) for c in by_problem.values()) / len(by_problem)
    subset_hits = []
    for c in by_problem.values():
        subsets = list(itertools.combinations(c, k))
        subset_hits.append(sum(any(s) for s in subsets) / len(subsets))
    return avg, sum(subset_hits) / len(subset_hits)


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=[pytest.mark.slow, needs_vllm_kernels])])
def test_pods_eval_on_a_toy_suite_and_samples_rescore_to_the_summary(tiny_dir, tmp_path, engine):
    assert main([str(tiny_dir), "--suite", "toy", "suite.samples=4", *SMALL, "--engine", engine, "--out", str(tmp_path)]) == 0
    out = tmp_path / "eval" / "toy"
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert {r["benchmark"] for r in rows} == {"toy_arith", "toy_long"}
    assert len(rows) == (4 + 3) * 4
    for name, m in summary["benchmarks"].items():
        mine = [r for r in rows if r["benchmark"] == name]
        assert sorted({r["sample"] for r in mine}) == [0, 1, 2, 3]
        for k in (1, 2, 4):
            avg, pass_k = rescore(mine, k)
            assert m["avg@n"] == pytest.approx(avg, abs=1e-12)  # float64 rounding of a mean of <= 28 terms
            assert m["pass@k"][str(k)] == pytest.approx(pass_k, abs=1e-12)
    macro = summary["macro"]["avg@n"]
    assert macro == pytest.approx(sum(m["avg@n"] for m in summary["benchmarks"].values()) / 2)
    assert "| toy_arith | 4 | 4 |" in (out / "table.md").read_text()
    assert json.loads((out / "config.json").read_text())["suite"]["samples"] == 4


def make_lora_run(tiny_dir, run_dir):
    """A run directory as a LoRA run leaves it: config.json and final/ holding only a (non-trivial) adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lora = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(tiny_dir)), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.5)  # B = 0 at init would make the adapter a no-op
    model.save_pretrained(str(run_dir / "final"))
    cfg = {"model": {"name": "tiny", "path": str(tiny_dir)}, "algorithm": {"name": "grpo"}, "hardware": {"finetune": "lora", "lora": lora}}
    (run_dir / "config.json").write_text(json.dumps(cfg))


def test_a_lora_run_directory_evaluates_the_adapter_not_the_base(tiny_dir, tmp_path):
    from pods.eval.weights import resolve

    run = tmp_path / "run"
    run.mkdir()
    make_lora_run(tiny_dir, run)
    target = resolve(str(run))
    assert (target.kind, target.base, target.lora["r"]) == ("final", str(tiny_dir), 4)
    greedy = ["suite.temperature=0", "suite.samples=1", "suite.only=[toy_arith]", *SMALL]
    assert main([str(run), "--suite", "toy", *greedy]) == 0
    assert main([str(tiny_dir), "--suite", "toy", *greedy, "--out", str(tmp_path / "base")]) == 0
    adapter = [json.loads(line)["completion"] for line in (run / "eval/toy/samples.jsonl").open()]
    base = [json.loads(line)["completion"] for line in (tmp_path / "base/eval/toy/samples.jsonl").open()]
    assert len(adapter) == len(base) == 4 and adapter != base


@pytest.mark.parametrize(
    "args,message",
    [
        (["--suite", "nope"], "unknown suite 'nope'"),
        (["--suite", "toy", "suite.only=[gsm8k]"], "unknown benchmark 'gsm8k'"),
        (["--suite", "toy", "suite.samples=2", "suite.ks=[4]"], "k = 4 > samples = 2"),
        (["--suite", "toy", "samples=2"], "overrides are suite keys"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_dir, capsys, args, message):
    assert main([str(tiny_dir), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_run_dir_without_weights_and_offline_hub_id_exit_2(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"model": {"name": "tiny", "builder": "tiny"}, "algorithm": {"name": "grpo"}, "hardware": {}})
    )
    assert main([str(run), "--suite", "toy"]) == 2
    assert "has no weights" in capsys.readouterr().err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["nobody-has/this-model-xyz", "--suite", "toy"]) == 2
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["-m", "pods.eval"], ["pods-eval"]])
def test_the_command_without_arguments_requires_only_the_model(command):
    """``python -m pods.eval`` (in-process, ``support.doors``) and the ``pods-eval`` entry point (pyproject:
    pods.eval.cli:main; a real process); the optional overrides are not named as missing."""
    if command[0] == "-m":
        p = door(command[1], [])
    else:
        p = subprocess.run([str(Path(sys.executable).parent / command[0])], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "the following argument is required: MODEL" in p.stderr, p.stderr
    assert "overrides" not in p.stderr and "usage: pods-eval MODEL [suite.KEY=VALUE ...]" in p.stderr


def test_the_engine_choices_are_the_engine_registry(tiny_dir, capsys):
    from pods.engines import ENGINES

    with pytest.raises(SystemExit) as e:
        main([str(tiny_dir), "--suite", "toy", "--engine", "nope"])
    assert e.value.code == 2
    assert f"choose from {', '.join(repr(n) for n in ENGINES.names())}" in capsys.readouterr().err
