"""``pods-eval --each-checkpoint RUN --launcher submitit`` on a REAL local SLURM (slurm-wlm + munge, started here,
stopped by pid afterwards; tests/support/slurm_cluster.py): one sbatch job per checkpoint of a tiny LoRA run (trained
here through ``python -m pods.train``), each writing its checkpoint's summary, then the submitter's curve.

Marked ``slurm`` (``make test-all``, ``.ci/run``); skips, saying why, where the cluster cannot start."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.config import ROOT
from support.runs import train_run
from support.slurm_cluster import started

pytestmark = pytest.mark.slurm

SUITE = ["--suite", "toy", "suite.only=[toy_arith]", "suite.benchmarks.toy_arith.size=4", "suite.samples=2", "suite.max_tokens=8"]


@pytest.fixture(scope="module")
def cluster():
    yield from started()


def test_each_checkpoint_is_one_slurm_job(cluster, tiny_dir, tmp_path):
    run = train_run(tmp_path / "run", "lora")
    env = {**cluster.env, "OMP_NUM_THREADS": "1", "PODS_SUBMITIT_CLUSTER": "slurm", "PODS_SLURM_CPUS": "1", "PODS_SLURM_MEM_GB": "2"}
    cmd = [sys.executable, "-m", "pods.eval", "--each-checkpoint", str(run), *SUITE, "--launcher", "submitit"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:] + cluster.logs()
    root = run / "eval" / "toy" / "checkpoints"
    jobs = sorted((root / ".submitit").glob("[0-9]*"))  # named by their SLURM job ids
    assert len(jobs) == 4 and all(cluster.state(j.name) == "COMPLETED" for j in jobs), cluster.logs()  # base + 3 steps
    for name in ("base", "step_000001", "step_000002", "step_000003"):
        summary = json.loads((root / name / "summary.json").read_text())
        weights = Path(summary["weights"])
        assert weights == run / "checkpoints" / f"{name}.pt" if name != "base" else (weights / "config.json").is_file()
        assert json.loads((root / name / "launch.json").read_text())["status"] == "finished"
    logs = " ".join(next(j.glob("*_log.out")).read_text() for j in jobs)
    points = [("base", 0), ("step_000001", 1), ("step_000002", 2), ("step_000003", 3)]
    assert all(f"[pods-eval] {n} (1/1, step {k})" in logs for n, k in points)
    rows = list(csv.DictReader((run / "eval" / "toy" / "curve.csv").open()))
    assert [r["step"] for r in rows] == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert os.path.getsize(run / "eval" / "toy" / "curve.png") > 0
