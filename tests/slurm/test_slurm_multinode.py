"""slurm/run_multinode.sbatch on a REAL two-node SLURM cluster: two slurmd (node1, node2) on this host, each with its
own name, port, spool and logs (Debian's slurm-wlm 22.05 runs two on one host without its emulator build), so srun
starts one task per node and torchrun's c10d rendezvous meets across them, as between two machines.

One rank per node on gloo (hardware=cpu_ddp2_zero3: DeepSpeed ZeRO-3, float32) against the same world size on one
node (slurm/run_8gpu.sbatch, 2 ranks): every step's loss and grad norm and the final weights are equal. A pre-emption
warning sent to the two-node job makes both ranks checkpoint and exit; the script requeues the job, and the requeued
job resumes to the same final weights as the uninterrupted runs. The one-node run is also the 8-GPU script's own test
(srun -> torchrun, 2 DeepSpeed ZeRO-3 CPU ranks, its last step's checkpoint kept): one DeepSpeed job serves both, not
two. Marked ``slurm`` (``make test-all``).
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from pods.metrics import read_metrics
from support.config import ROOT
from support.slurm_cluster import LocalCluster, started

pytestmark = pytest.mark.slurm

STEPS = 6  # 1.3 s each idle, 8-9 s at load 8; the warning sent after step 1 landed within step 2 (load 3 and 8): 4 steps of room
ARGS = [
    "experiment=toy_pods_64_16_cpu",
    "hardware=cpu_ddp2_zero3",
    f"train.max_steps={STEPS}",
    "train.time_budget_s=null",
    "eval.max_examples=8",
    "eval.repeats=1",
    "eval.every_s=null",
    "eval.every_steps=null",
    "eval.at_start=false",
]
WEIGHTS = ("train.checkpoint_at_end=weights",)  # the two-node runs: final/ only
FULL = ("train.checkpoint_at_end=full", "train.save_final=true")  # the one-node run: final/ and its last step's checkpoint
NODE = ["--cpus-per-task=2", "--mem=3G"]  # per node; the scripts' #SBATCH lines ask for 8 (stand-in) GPUs and --exclusive
TIMEOUT_S = 600  # one job here: about 1-2 min on 2 shared cores (DeepSpeed start-up on two ranks dominates)


@pytest.fixture(scope="module")
def cluster():
    yield from started(nodes=2)


@pytest.fixture(scope="module")
def one_node(cluster, tiny_dir, tmp_path_factory):
    """sbatch slurm/run_8gpu.sbatch on one node (8 stand-in GPUs, --exclusive): srun -> torchrun with 2 CPU processes
    running DeepSpeed ZeRO-3 on gloo (hardware=cpu_ddp2_zero3). Returns (run directory, job log)."""
    tmp = tmp_path_factory.mktemp("one_node")
    job = submit(cluster, "run_8gpu.sbatch", tmp / "run", tmp, [*NODE, "--nodes=1"], FULL, PODS_NPROC="2")
    return tmp / "run", finished(cluster, job, tmp)


def submit(cluster: LocalCluster, script: str, run_dir, tmp_path, resources: list[str], args: tuple = (), **env) -> str:
    env = {
        **cluster.env,
        "PODS_ROOT": str(ROOT),
        "PODS_PYTHON": sys.executable,
        "PODS_RUN_DIR": str(run_dir),
        "PODS_ALLOW_CPU": "1",
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",  # both nodes are this host; on a cluster: the interface between the nodes
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")),
        **env,
    }
    cmd = ["sbatch", "--parsable", *resources, "--time=15", f"--output={tmp_path}/%j.out", str(ROOT / "slurm" / script), *ARGS, *args]
    return cluster.run(cmd, env=env, cwd=tmp_path).stdout.strip().split(";")[0]


def finished(cluster: LocalCluster, job: str, tmp_path) -> str:
    state = cluster.wait(job, timeout=TIMEOUT_S)
    log = (tmp_path / f"{job}.out").read_text()
    assert state == "COMPLETED", (state, log[-4000:], cluster.logs())
    return log


def weights(run_dir) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted((run_dir / "final").glob("*.safetensors")) for k, v in load_file(f).items()}


def assert_same_run(a, b) -> None:
    """Same steps, same loss and grad norm per step, same final weights (same world size, same gloo reductions: the
    runs are identical to the last bit; exactness is what is checked)."""
    ra, rb = read_metrics(a / "metrics.jsonl", "train"), read_metrics(b / "metrics.jsonl", "train")
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == list(range(1, STEPS + 1))
    numbers = ("loss", "grad_norm", "reward_mean_all")
    assert [[r[k] for k in numbers] for r in ra] == [[r[k] for k in numbers] for r in rb]
    wa, wb = weights(a), weights(b)
    assert wa and wa.keys() == wb.keys()
    assert all(wa[k].equal(wb[k]) for k in wa), [k for k in wa if not wa[k].equal(wb[k])][:5]


def test_8gpu_script_srun_torchrun_two_cpu_ranks(one_node):
    """Rank 0 writes the metrics and prints the run directory once; the job COMPLETED (``finished``), so both ranks
    exited 0; the last step's checkpoint is there (train.checkpoint_at_end=full)."""
    run_dir, log = one_node
    assert log.count("[pods] run directory:") == 1  # rank 0 prints; COMPLETED needs both ranks to exit 0
    setup = read_metrics(run_dir / "metrics.jsonl", "setup")[0]
    assert setup["world_size"] == 2 and len(read_metrics(run_dir / "metrics.jsonl", "train")) == STEPS
    assert list((run_dir / "checkpoints").glob(f"step_{STEPS:06d}*"))


def test_two_nodes_equal_one_node_of_the_same_world_size_and_a_preempted_run_resumes_to_the_same(cluster, one_node, tmp_path):
    one, two, cut = one_node[0], tmp_path / "two_nodes", tmp_path / "two_nodes_preempted"
    per_node = ("hardware.nproc_per_node=1", *WEIGHTS)  # 2 nodes x 1 rank: the world pods.train checks (the script adds hardware.nnodes=2)
    job2 = submit(cluster, "run_multinode.sbatch", two, tmp_path, [*NODE, "--nodes=2"], per_node, PODS_NPROC="1")
    job3 = submit(cluster, "run_multinode.sbatch", cut, tmp_path, [*NODE, "--nodes=2"], per_node, PODS_NPROC="1")

    log2 = finished(cluster, job2, tmp_path)
    assert "2 node(s) x 1 rank(s) (node[1-2]): c10d rendezvous at 127.0.0.1:" in log2
    assert "[pods] passed to every rank: GLOO_SOCKET_IFNAME=lo" in log2
    nodes = [ln for ln in log2.splitlines() if ln.startswith("[pods] node ") and ln.endswith(": GLOO_SOCKET_IFNAME=lo")]
    assert len(nodes) == 2, log2[-4000:]  # each node says which interface its gloo groups use
    setup = read_metrics(two / "metrics.jsonl", "setup")[0]
    assert setup["world_size"] == 2

    deadline = time.time() + TIMEOUT_S  # the third job starts when the second ends: both nodes
    while not (cut / "metrics.jsonl").exists() or not read_metrics(cut / "metrics.jsonl", "train"):
        assert time.time() < deadline and cluster.state(job3) in ("PENDING", "RUNNING", "UNKNOWN"), (cluster.state(job3), cluster.logs())
        time.sleep(0.3)
    cluster.run(["scancel", "--batch", "--signal=USR1", job3])  # SLURM's time-limit warning, to the batch script
    log3 = finished(cluster, job3, tmp_path)
    assert cluster.job(job3)["Restarts"] == "1" and "requeueing job" in log3 and "resumed from" in log3, log3[-4000:]
    stopped = [r["step"] for r in read_metrics(cut / "metrics.jsonl", "train")]
    assert stopped == list(range(1, STEPS + 1))  # each step once across the two starts

    assert_same_run(one, two)
    assert_same_run(two, cut)
