"""The launchers on a REAL local SLURM (slurm-wlm + munge from Debian, started here, stopped by pid afterwards):
a Hydra multirun through hydra-submitit-launcher, the 1-GPU sbatch script (CPU fallback, pre-emption warning ->
checkpoint -> requeue -> resume), and the 8-GPU script's srun + torchrun line with 2 DeepSpeed ZeRO-3 CPU ranks.

The cluster needs root and apt-get the first time (tests/slurm_cluster.py installs the packages); the tests
skip, saying so, only where Debian packages cannot be installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from pods.metrics import read_metrics
from slurm_cluster import LocalCluster, install_reason

SHORT = ["train.time_budget_s=null", "eval.max_examples=8", "eval.repeats=1", "eval.every_s=null"]


@pytest.fixture(scope="module")
def cluster():
    reason = install_reason()
    if reason:
        pytest.skip(reason)
    with LocalCluster(cpus=2, mem_mb=8000, gpus=8) as c:
        yield c


def job_env(cluster: LocalCluster, **kw) -> dict:
    return {
        **cluster.env, "PODS_ROOT": str(ROOT), "PODS_PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")), **kw,
    }


def sbatch(cluster: LocalCluster, script: str, args: list[str], tmp_path, env: dict, resources: list[str]) -> str:
    cmd = ["sbatch", "--parsable", *resources, "--time=10", f"--output={tmp_path}/%j.out", str(ROOT / "slurm" / script), *args]
    return cluster.run(cmd, env=env, cwd=tmp_path).stdout.strip().split(";")[0]


def test_hydra_multirun_through_the_submitit_launcher(cluster, tiny_dir, tmp_path):
    """Two seeds of a tiny experiment as a SLURM job array (hydra/launcher=slurm_cpu); both runs write metrics."""
    cmd = [sys.executable, "-m", "pods.train", "-m", "hydra/launcher=slurm_cpu", "experiment=toy_pods_64_16_cpu", "+sweep=seeds_cpu",
           "seed=1,2", "train.max_steps=2", *SHORT, f"hydra.sweep.dir={tmp_path}"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=job_env(cluster), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:] + cluster.logs()
    runs = sorted(d for d in tmp_path.iterdir() if (d / "metrics.jsonl").exists())
    assert [json.loads((d / "config.json").read_text())["seed"] for d in runs] == [1, 2]
    for d in runs:
        assert len(read_metrics(d / "metrics.jsonl", "train")) == 2
        hydra_yaml = (d / ".hydra" / "hydra.yaml").read_text()
        assert "id: " in hydra_yaml and "job_id_for" not in hydra_yaml  # the SLURM job id, set inside the job
    script = next((tmp_path / ".submitit").glob(".submission_file_*.sh")).read_text()
    assert "#SBATCH --array=0-1" in script and "#SBATCH --signal=USR2@300" in script and "#SBATCH --requeue" in script


def test_1gpu_script_runs_on_cpu_checkpoints_on_the_warning_requeues_and_resumes(cluster, tiny_dir, tmp_path):
    """sbatch slurm/run_1gpu.sbatch with its real #SBATCH lines (1 GPU: the node's stand-in). No GPU is visible, so
    it falls back to CPU. The pre-emption warning (--signal=B:USR1, sent here at once with scancel --batch) makes the
    run checkpoint and exit, the script requeues the job, and the requeued job resumes to the end."""
    run_dir = tmp_path / "run"
    args = ["experiment=toy_grpo_16_16_cpu", "train.max_steps=6", "eval.at_start=false", *SHORT]
    job = sbatch(cluster, "run_1gpu.sbatch", args, tmp_path, job_env(cluster, PODS_RUN_DIR=str(run_dir)), ["--cpus-per-task=2", "--mem=2G"])
    deadline = time.time() + 180  # generous: the tests may share 2 cores with others
    while not (run_dir / "metrics.jsonl").exists() or not read_metrics(run_dir / "metrics.jsonl", "train"):
        assert time.time() < deadline and cluster.state(job) in ("PENDING", "RUNNING"), (cluster.state(job), cluster.logs())
        time.sleep(0.3)
    cluster.run(["scancel", "--batch", "--signal=USR1", job])
    while cluster.run(["scontrol", "-o", "show", "job", job]).stdout.count("Restarts=1") == 0:
        assert time.time() < deadline and cluster.state(job) != "COMPLETED", "the job finished without being requeued"
        time.sleep(0.3)
    while cluster.state(job) == "PENDING":  # a requeued job waits ~2 min by default; start it now
        cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
        time.sleep(0.5)
    assert cluster.wait(job, timeout=240) == "COMPLETED", (tmp_path / f"{job}.out").read_text()[-3000:] + cluster.logs()
    log = (tmp_path / f"{job}.out").read_text()
    assert "no GPU visible: running on CPU" in log and "requeueing job" in log and "resumed from" in log
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "train")]
    assert steps == list(range(1, 7))  # every step exactly once across the two job starts
    assert (run_dir / "checkpoints" / "step_000006.pt").exists()


def test_8gpu_script_srun_torchrun_two_cpu_ranks(cluster, tiny_dir, tmp_path):
    """sbatch slurm/run_8gpu.sbatch (8 stand-in GPUs, --exclusive): srun -> torchrun with 2 CPU processes running
    DeepSpeed ZeRO-3 on gloo (hardware=cpu_ddp2_zero3); rank 0 writes the metrics, both ranks finish."""
    run_dir = tmp_path / "run"
    args = ["experiment=toy_pods_64_16_cpu", "hardware=cpu_ddp2_zero3", "train.max_steps=2", *SHORT]
    env = job_env(cluster, PODS_RUN_DIR=str(run_dir), PODS_NPROC="2")
    job = sbatch(cluster, "run_8gpu.sbatch", args, tmp_path, env, ["--cpus-per-task=2", "--mem=4G"])
    assert cluster.wait(job, timeout=300) == "COMPLETED", (tmp_path / f"{job}.out").read_text()[-3000:] + cluster.logs()
    log = (tmp_path / f"{job}.out").read_text()
    assert log.count("[pods] run directory:") == 2  # one line per rank
    setup = read_metrics(run_dir / "metrics.jsonl", "setup")[0]
    assert setup["world_size"] == 2 and len(read_metrics(run_dir / "metrics.jsonl", "train")) == 2
    assert list((run_dir / "checkpoints").glob("step_000002*"))
