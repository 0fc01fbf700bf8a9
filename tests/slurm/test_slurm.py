"""The launchers on a REAL local SLURM (slurm-wlm + munge from Debian, started here, stopped by pid afterwards):
a Hydra multirun through hydra-submitit-launcher, pods.launch's plain-submitit launcher with that plug-in hidden, and the 1-GPU sbatch script (CPU fallback, pre-emption warning ->
checkpoint -> requeue -> resume). The 8-GPU script's srun + torchrun line with 2 DeepSpeed ZeRO-3 CPU ranks is tested in
test_slurm_multinode.py, on the one-node run its two-node runs are compared with (one DeepSpeed job for both).

Marked ``slurm`` (``make test-all``, ``.ci/run``). The cluster needs slurm-wlm + munge: with PODS_INSTALL_SLURM=1 (as
``.ci/run`` sets) and root, tests/support/slurm_cluster.py apt-gets them; otherwise the tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from pods.metrics import read_metrics
from support.config import ROOT
from support.plain_submitit import HIDDEN, submit_without_plugin
from support.slurm_cluster import LocalCluster, started

pytestmark = pytest.mark.slurm


EVAL = ["eval.max_examples=8", "eval.repeats=1", "eval.every_s=null"]
SHORT = ["train.time_budget_s=null", *EVAL]


@pytest.fixture(scope="module")
def cluster():
    yield from started()


def job_env(cluster: LocalCluster, **kw) -> dict:
    return {
        **cluster.env,
        "PODS_ROOT": str(ROOT),
        "PODS_PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")),
        **kw,
    }


def sbatch(cluster: LocalCluster, script: str, args: list[str], tmp_path, env: dict, resources: list[str]) -> str:
    cmd = ["sbatch", "--parsable", *resources, "--time=10", f"--output={tmp_path}/%j.out", str(ROOT / "slurm" / script), *args]
    return cluster.run(cmd, env=env, cwd=tmp_path).stdout.strip().split(";")[0]


def test_hydra_multirun_through_the_submitit_launcher(cluster, tiny_dir, tmp_path):
    """Two seeds of a tiny experiment as a SLURM job array (hydra/launcher=slurm_cpu); both runs write metrics.
    Seed 1's job is pre-empted on the way (submitit's SIGUSR2): submitit requeues it and the requeued job resumes
    from the run's latest checkpoint (train.resume=auto from the sweep file)."""
    cmd = [
        sys.executable,
        "-m",
        "pods.train",
        "-m",
        "hydra/launcher=slurm_cpu",
        "experiment=toy_pods_64_16_cpu",
        "+sweep=seeds_cpu",
        "seed=1,2",
        "train.max_steps=null",
        "train.time_budget_s=12",
        "train.checkpoint_every_steps=2",
        *EVAL,
        f"hydra.sweep.dir={tmp_path}",
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=job_env(cluster))
    deadline = time.time() + 240
    while not list(tmp_path.glob("*seed=1*/checkpoints/step_000002.pt")):
        assert time.time() < deadline and p.poll() is None, (p.poll(), cluster.logs())
        time.sleep(0.3)
    array = cluster.run(["squeue", "-h", "-o", "%F"]).stdout.split()[0]
    cluster.run(["scancel", "--signal=USR2", f"{array}_0"])  # what submitit asks SLURM for before the time limit
    assert cluster.wait(f"{array}_0", timeout=deadline - time.time()) == "COMPLETED", cluster.logs()
    out = p.communicate(timeout=max(1, deadline - time.time()))[0]
    assert p.returncode == 0, out[-3000:] + cluster.logs()
    runs = sorted(d for d in tmp_path.iterdir() if (d / "metrics.jsonl").exists())
    assert [json.loads((d / "config.json").read_text())["seed"] for d in runs] == [1, 2]
    for d in runs:
        steps = [r["step"] for r in read_metrics(d / "metrics.jsonl", "train")]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2  # each step once, across the requeue
        job_id = yaml.safe_load((d / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["id"]
        assert str(job_id).startswith(f"{array}_")  # the SLURM array task, set inside the job
    log0, log1 = (next((tmp_path / ".submitit" / f"{array}_{i}").glob("*_log.out")).read_text() for i in (0, 1))
    assert "Caught signal SIGUSR2" in log0 and "resumed from" in log0 and "resumed from" not in log1
    script = next((tmp_path / ".submitit").glob(".submission_file_*.sh")).read_text()
    assert "#SBATCH --array=0-1" in script and "#SBATCH --signal=USR2@300" in script and "#SBATCH --requeue" in script


def test_plain_submitit_launcher_without_hydra_submitit_launcher(cluster, tiny_dir, tmp_path):
    """``launch(..., "submitit")`` on SLURM with no process able to import hydra-submitit-launcher: submitit's own
    SlurmExecutor sbatches one job, which runs ``pods.train``; the submitting process waits and marks the run."""
    run_dir = tmp_path / "runs" / "plain"
    env = job_env(cluster, PODS_SUBMITIT_CLUSTER="slurm", PODS_SLURM_CPUS="2", PODS_SLURM_MEM_GB="2")
    p = submit_without_plugin(run_dir, tmp_path, env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:] + cluster.logs()
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "train")] == [1, 2]
    assert launch_state(run_dir) == ("finished", "slurm")
    (job_dir,) = (tmp_path / "runs" / ".submitit").glob("[0-9]*")  # named by the SLURM job id
    assert cluster.state(job_dir.name) == "COMPLETED", cluster.logs()
    log = next(job_dir.glob("*_0_log.out")).read_text()
    assert f"[pods] run directory: {run_dir}" in log and HIDDEN in log  # the job's pods.train found no Hydra plug-in
    script = next((tmp_path / "runs" / ".submitit").rglob("*submission*.sh")).read_text()
    assert "#SBATCH --cpus-per-task=2" in script and "--gpus-per-node" not in script


def launch_state(run_dir) -> tuple[str, str]:
    state = json.loads((run_dir / "launch.json").read_text())
    return state["status"], state["launcher"]


def test_1gpu_script_runs_on_cpu_checkpoints_on_the_warning_requeues_and_resumes(cluster, tiny_dir, tmp_path):
    """sbatch slurm/run_1gpu.sbatch with its real #SBATCH lines (1 GPU: the node's stand-in). No GPU is visible, so
    it runs on CPU as PODS_ALLOW_CPU=1 asks. The pre-emption warning (--signal=B:USR1, sent here at once with scancel --batch) makes the
    run checkpoint and exit, the script requeues the job, and the requeued job resumes to the end."""
    run_dir = tmp_path / "run"
    args = ["experiment=toy_grpo_16_16_cpu", "train.max_steps=null", "train.time_budget_s=12", "eval.at_start=false", *EVAL]
    job = sbatch(
        cluster,
        "run_1gpu.sbatch",
        args,
        tmp_path,
        job_env(cluster, PODS_RUN_DIR=str(run_dir), PODS_ALLOW_CPU="1"),
        ["--cpus-per-task=2", "--mem=2G"],
    )
    deadline = time.time() + 180  # generous: the tests may share 2 cores with others
    while not (run_dir / "metrics.jsonl").exists() or not read_metrics(run_dir / "metrics.jsonl", "train"):
        assert time.time() < deadline and cluster.state(job) in ("PENDING", "RUNNING", "UNKNOWN"), (cluster.state(job), cluster.logs())
        time.sleep(0.3)
    cluster.run(["scancel", "--batch", "--signal=USR1", job])
    state = cluster.wait(job, timeout=240)
    log = (tmp_path / f"{job}.out").read_text()
    assert state == "COMPLETED" and cluster.job(job)["Restarts"] == "1", (state, log[-3000:], cluster.logs())
    assert "no GPU visible and PODS_ALLOW_CPU=1: running on CPU" in log and "requeueing job" in log and "resumed from" in log
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "train")]
    assert steps == list(range(1, len(steps) + 1))  # every step exactly once across the two job starts
    assert read_metrics(run_dir / "metrics.jsonl", "train")[-1]["train_time"] >= 12  # the whole budget, not just the first part
    assert (run_dir / "checkpoints" / f"step_{steps[-1]:06d}.pt").exists()
