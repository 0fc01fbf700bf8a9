"""``benchmarks/bench_figure1_cpu.py`` (``make figure1-cpu``) run as its command on the smallest sizes (about 30 s):
Figure 1 on the warm-started tiny model and the per-step view GRPO(n) vs PODS(n->16) through the loop's own step.

What could fail: the per-step rows come from ``pods.loop.rollout_step`` with the CPU experiments' configs, so GRPO
trains all 2n rollouts (micro-batches of 16) and PODS 2 x 16; both arms generate the same rollouts (same prompts and
seed); PODS's update at n = 32 costs well under GRPO's (half the sequences), generation grows with n, and the update's
memory grows with the micro-batch. A bad ``--rollouts`` is refused (exit 2, argparse's usage and one error line) before any model loads.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.doors import door

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_figure1_cpu.py"


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # a benchmark run (20-30 s): make test-all
def test_per_step_view_grpo_vs_pods_on_the_tiny_model(tmp_path):
    sizes = ["--rollouts", "16,32", "--repeats", "2", "--batches", "2,8", "--micro-batches", "1,4"]
    proc = run(*sizes, "--in-process", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = tmp_path / "figure1_toy"

    gen = rows(d / "generation.csv")  # bench_gpu's Figure 1(a) on the tiny model: the toy prompts, 12 tokens
    assert [int(r["rollouts"]) for r in gen] == [2, 8] and all(r["model"] == "tiny" and r["completion_len"] == "12" for r in gen)
    upd = [r for r in rows(d / "update.csv") if r["finetune"] == "full"]
    assert [(int(r["batch"]), int(r["accum_steps"])) for r in upd] == [(1, 1), (4, 1), (8, 2)]
    assert float(upd[1]["mem_update_mib"]) > float(upd[0]["mem_update_mib"]) > 0

    steps = rows(d / "step.csv")
    assert len(steps) == 2 * 2 * 2  # arms x n x repeats
    for r in steps:
        n, trained = int(r["n"]), int(r["trained"])
        assert int(r["rollouts"]) == 2 * n and int(r["kept"]) == trained == (2 * n if r["arm"] == "GRPO" else 32)
        assert int(r["micro_batches"]) == trained // 16  # hardware=cpu_mb16: micro-batches of 16
        t_gen, t_upd = float(r["t_generate"]), float(r["t_update"])
        assert t_gen > 0 and t_upd > 0 and float(r["step_s"]) >= t_gen + t_upd
    by = {(r["arm"], r["n"], r["repeat"]): r for r in steps}
    for (arm, n, rep), r in by.items():  # same prompts and seed: the same rollouts, token for token in count
        assert r["tokens"] == by[("GRPO" if arm == "PODS" else "PODS", n, rep)]["tokens"]

    summary = {int(s["n"]): s for s in rows(d / "step_summary.csv")}
    assert float(summary[32]["pods_update_over_grpo"]) < 0.8, summary[32]  # PODS trains 32 sequences, GRPO 64
    assert float(summary[32]["pods_over_grpo"]) < 1.0
    assert float(summary[32]["generate_s"]) > float(summary[16]["generate_s"])  # 64 rollouts per step vs 32
    text = (d / "summary.txt").read_text()
    assert "Figure 1(b) update" in text and "PODS/GRPO" in text and "uptime before" in text and "torch threads 1" in text
    assert (d / "figure1.png").stat().st_size > 10_000 and (d / "figure1_step.png").stat().st_size > 10_000


def test_bad_rollouts_are_refused_before_any_model_loads(tmp_path):
    proc = door(SCRIPT, ["--rollouts", "8,16", "--out", tmp_path])  # in-process, as __main__ (support.doors); its process: above
    assert proc.returncode == 2 and "every n must be >= 16" in proc.stderr
    assert not any(tmp_path.iterdir())
