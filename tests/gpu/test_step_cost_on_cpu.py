"""The GPU step-cost bench (``benchmarks/bench_gpu.py --step-cost``) writes the ``step_summary.csv`` that the cost model
of ``python -m pods.demo per-step-summarize`` reads: fast, its summary of hand-made step rows read back by the demo;
slow, the CPU mode for real (the tiny model, the loop's three arms, LoRA and full fine-tuning, one round) through the
command, then the demo reads what it wrote. The CSVs go to a temporary directory, never results/. No ``gpu`` marker:
both run on a CPU (the CUDA mode runs in scripts/gpu_smoke.sh's step-cost step on a lent GPU)."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest

from support.config import ROOT
from support.doors import door

sys.path.insert(0, str(ROOT / "benchmarks"))


def write_run(path: Path, accs: list[float]) -> None:
    """A run's metrics.jsonl: an evaluation every 2 steps with these accuracies."""
    rows = [{"kind": "setup", "step": 0}]
    for i, a in enumerate(accs):
        rows.append({"kind": "eval", "step": 2 * i, "train_time": 1.0 * i, "accuracy": a, "n_eval": 800})
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def demo_reads(out: Path, gpu: Path) -> str:
    """``python -m pods.demo per-step-summarize`` (in-process) over hand-made runs, the cost model pointed at ``gpu``."""
    from pods import demo

    for k in (1, 2, 3):
        write_run(out / "runs" / demo.PER_STEP[demo.GRPO] / f"seed{k}", [0.1, 0.25, 0.4])
        write_run(out / "runs" / demo.PER_STEP[demo.PODS] / f"seed{k}", [0.1, 0.4, 0.7])
    p = door("pods.demo", ["per-step-summarize", "--out", str(out), "--gpu-results", str(gpu)])
    assert p.returncode == 0, p.stderr[-3000:]
    return (out / "summary.txt").read_text()


def test_the_cost_model_reads_the_step_summary_the_bench_writes(tmp_path):
    import bench_gpu
    import step_cost

    rows = []
    for ft, (g, p, ga) in {"lora": (2.0, 3.0, 6.0), "full": (1.0, 1.5, 4.0)}.items():
        for rep in range(4):
            for arm, s in (("grpo16", g), ("pods", p), ("ga", ga)):
                rows.append({"finetune": ft, "arm": arm, "repeat": rep, "engine": "hf", "completion_tokens": 256, "mem_kind": "x",
                             "t_generate": s / 2, "t_update": s / 2, "step_s": s * (1 + rep / 10), "peak_gib": 1.0})  # fmt: skip
    summary = step_cost.summarise(rows, "qwen2.5-3b")
    assert [s["finetune"] for s in summary] == ["lora", "full"] and summary[0]["pods_over_grpo16"] == pytest.approx(1.5)
    (tmp_path / "gpu" / "h100").mkdir(parents=True)
    bench_gpu.write_csv(tmp_path / "gpu" / "h100" / "step_summary.csv", summary)
    text = demo_reads(tmp_path / "demo", tmp_path / "gpu")
    assert "step-cost bench ratios found: 1" in text
    assert re.search(r"model, step-cost bench h100 lora: PODS step 1\.50x: .*pooled \S+x", text), text


@pytest.mark.slow
def test_the_cpu_mode_writes_what_the_demo_reads(tmp_path):
    args = ["--step-cost", "--device", "cpu", "--repeats", "1", "--in-process", "--out", str(tmp_path / "gpu"), "--name", "cpu"]
    p = door(ROOT / "benchmarks" / "bench_gpu.py", args)  # the command, in-process
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with (tmp_path / "gpu" / "cpu" / "step_summary.csv").open() as f:
        summary = list(csv.DictReader(f))
    assert [(r["n"], r["finetune"], r["model"]) for r in summary] == [("64", "lora", "tiny"), ("64", "full", "tiny")]
    for r in summary:
        assert all(float(r[f"{arm}_step_s"]) >= float(r[f"{arm}_update_s"]) > 0 for arm in ("grpo16", "pods", "ga"))
        assert float(r["pods_generate_s"]) > float(r["grpo16_generate_s"])  # 64 rollouts against 16
        assert float(r["ga_update_s"]) > float(r["pods_update_s"])  # 64 sequences trained against 16
    steps = list(csv.DictReader((tmp_path / "gpu" / "cpu" / "step_cost.csv").open()))
    assert len(steps) == 6 and {(s["arm"], s["n"], s["m"]) for s in steps} == {
        ("grpo16", "16", "16"),
        ("pods", "64", "16"),
        ("ga", "64", "16"),
    }
    text = demo_reads(tmp_path / "demo", tmp_path / "gpu")
    assert f"model, step-cost bench cpu lora: PODS step {float(summary[0]['pods_over_grpo16']):.2f}x" in text
