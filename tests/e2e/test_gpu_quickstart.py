"""The one-GPU quickstart (``make gpu-quickstart``): its two experiment files differ only in the down-sampling rule,
the estimate fits one H100 with ``train.time_budget_s`` about 30 minutes an arm, the target runs both arms here and
then draws their figure, and the figure prints the band speed-up. The files' run through ``python -m pods.train`` on
the tiny model is tests/e2e/test_experiments.py's (every GPU file; these two are code paths of their own there)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from support.config import ROOT, compose
from support.doors import door

ARMS = ("gsm8k_qwen0_5b_grpo_ga_1gpu", "gsm8k_qwen0_5b_pods_1gpu")


def test_the_arms_differ_only_in_the_rule_and_fit_one_h100_in_about_half_an_hour():
    from pods.memory.estimator import estimate
    from pods.schema import check

    ga, pods = (compose([f"experiment={a}"]) for a in ARMS)
    assert {k: v for k, v in ga["algorithm"].items() if ga["algorithm"][k] != pods["algorithm"][k]} == {
        "name": "grpo_ga",
        "rule": "all",
        "grad_accum": True,
    }
    assert {k: v for k, v in ga.items() if k != "algorithm"} == {k: v for k, v in pods.items() if k != "algorithm"}
    assert ga["model"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct" and ga["rollout"]["name"] == "vllm"
    assert (ga["dataset"]["name"], ga["dataset"]["prompt_format"], ga["dataset"]["grader"]) == ("gsm8k", "pods_instruct", "lenient")
    assert ga["hardware"]["nproc_per_node"] == 1 and ga["hardware"]["gpu_memory_gb"] == 80
    assert ga["train"]["time_budget_s"] == 1500 and ga["eval"]["every_s"] == 300  # 25 min + 6 evaluations + start-up
    for cfg in (ga, pods):
        est = estimate(check(cfg))
        assert est.fits and est.total_gb < 50, est.table()


def test_make_gpu_quickstart_runs_both_arms_here_then_draws_the_figure():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "FIG")}
    out = subprocess.run(
        ["make", "-s", "-n", "-o", ".venv/.installed-cpu", "gpu-quickstart", "GPU_PY=/env/bin/python"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    run, draw = out.stdout.strip().split(" && ")
    assert run.startswith("GPU_PY=/env/bin/python ") and "pods.figures reproduce gpu-quickstart" in run
    assert "--launcher local --seeds 1" in run and draw.endswith("--out results/figure-gpu-quickstart")


def write_run(run_dir, exp: str, accuracies: list[float]) -> None:
    """A finished run of ``exp`` as pods.train leaves it for the figure: config.json and one evaluation per 5 min."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(compose([f"experiment={exp}"])))
    rows = [{"kind": "eval", "step": 10 * i, "train_time": 300.0 * i, "accuracy": a} for i, a in enumerate(accuracies)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_quickstart_figure_prints_the_band_speed_up(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "figure"
    write_run(runs / "ga", ARMS[0], [0.30, 0.33, 0.36, 0.39, 0.42, 0.45])
    write_run(runs / "pods", ARMS[1], [0.30, 0.36, 0.42, 0.45, 0.47, 0.48])  # the GA arm's path in about half the time
    p = door("pods.figures", ["plot", "gpu-quickstart", "--runs", str(runs), "--out", str(out)])
    assert p.returncode == 0, p.stderr[-2000:]
    band = [line for line in p.stdout.splitlines() if "PODS 64→16 vs GRPO-GA 64/16 by time, band" in line]
    assert len(band) == 1 and "pooled" in band[0], p.stdout
    speedup = float(band[0].split("pooled ")[1].split("x")[0])
    assert speedup == pytest.approx(2.0, rel=0.35)
    assert (out / "accuracy_vs_time.png").stat().st_size > 10_000 and (out / "mean_curves.csv").is_file()
