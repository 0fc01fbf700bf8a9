"""slurm/run_async.sbatch's shape on a REAL two-node SLURM cluster (two slurmd on this host, stand-in GPUs counted by
``Gres``): the trainer's processes are the profile's ``hardware.nproc_per_node`` (torchrun when more than one), K is
the run's ``rollout.servers`` count (not every GPU of the node), and a shape that does not fit the allocation is
refused in one line before any server starts. ``PODS_DRY_RUN=1``: the job prints the shape and both command lines and
starts nothing (the servers and the trainer themselves: tests/vllm_cpu, tests/e2e). Marked ``slurm``."""

from __future__ import annotations

import sys

import pytest

from support.config import ROOT
from support.slurm_cluster import started

pytestmark = pytest.mark.slurm

ARGS = ["experiment=toy_pods_64_16_cpu", "train.max_steps=1"]
NODE = ["--nodes=2", "--cpus-per-task=1", "--mem=1G", "--time=15"]  # the script asks for SIGUSR1 300 s before the limit


@pytest.fixture(scope="module")
def cluster():
    yield from started(nodes=2)


def job(cluster, tmp_path, gpus: int, args: list[str], **given) -> tuple[str, str]:
    """(final state, log) of ``sbatch --gpus-per-node=GPUS slurm/run_async.sbatch ARGS`` as a dry run (``given``: more
    environment)."""
    env = {**cluster.env, "PODS_ROOT": str(ROOT), "PODS_PYTHON": sys.executable, "PODS_RUN_DIR": str(tmp_path / "run")}
    env |= {"PODS_ALLOW_CPU": "1", "PODS_DRY_RUN": "1", "OMP_NUM_THREADS": "1", **given}
    cmd = [
        "sbatch",
        "--parsable",
        *NODE,
        f"--gpus-per-node={gpus}",
        f"--output={tmp_path}/%j.out",
        str(ROOT / "slurm" / "run_async.sbatch"),
    ]
    jid = cluster.run([*cmd, *ARGS, *args], env=env, cwd=tmp_path).stdout.strip().split(";")[0]
    state = cluster.wait(jid, timeout=300)
    return state, (tmp_path / f"{jid}.out").read_text() + f"\n(job {jid}: {cluster.job(jid)})"


def test_the_trainer_runs_the_profiles_processes_and_k_is_the_runs_server_count(cluster, tmp_path):
    state, log = job(cluster, tmp_path, 2, ["hardware=cpu_ddp2_zero3"])
    assert state == "COMPLETED", log[-3000:]
    assert "[pods] trainer: 2 process(es) on node1; 1 server(s) on node2" in log
    trainer = next(ln for ln in log.splitlines() if ln.startswith("[pods] trainer: bash -c"))
    assert "-m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=2 -m pods.train" in trainer
    assert "rollout=vllm_server rollout.servers=[http://" in trainer and trainer.count(":8000") == 1


def test_k_is_not_every_gpu_of_the_node(cluster, tmp_path):
    state, log = job(cluster, tmp_path, 8, ["hardware=cpu"])
    assert state == "COMPLETED", log[-3000:]
    assert "[pods] trainer: 1 process(es) on node1; 1 server(s) on node2" in log  # before: 8 servers, a 1-process trainer
    state, log = job(cluster, tmp_path, 8, ["hardware=cpu"], PODS_SERVERS="3")
    assert state == "COMPLETED" and "; 3 server(s) on node2" in log, log[-3000:]


def test_a_shape_that_does_not_fit_is_refused_before_any_server_starts(cluster, tmp_path):
    state, log = job(cluster, tmp_path, 1, ["hardware=cpu_ddp2_zero3"])
    assert state == "FAILED"
    assert "async_shape.py: hardware.nproc_per_node=2 trainer processes but 1 GPU(s) per node: sbatch --gpus-per-node=2" in log
    assert "server(s) on" not in log and not list(tmp_path.glob("run/server-*.log"))
    state, log = job(cluster, tmp_path, 2, ["hardware=cpu_ddp2_zero3", "train.max_staleness=1", "rollout.max_model_len=4"])
    assert state == "FAILED" and "rollout.max_model_len (4) <" in log and "server(s) on" not in log  # the trainer's own rule, up front
