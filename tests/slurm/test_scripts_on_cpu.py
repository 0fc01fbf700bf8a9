"""slurm/common.sh's launch decisions, run in bash without SLURM (issue 32 items 4 and 5): the ranks per node come from
the profile (a 4-GPU recipe on an 8-GPU node gets 4), and each node of a multi-node job gives gloo an interface that
reaches the rendezvous host (gloo otherwise takes the hostname's address: vLLM's group over all ranks can hang)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.config import ROOT
from support.harness import worker_env


def bash(line: str, **env) -> subprocess.CompletedProcess:
    script = f'set -uo pipefail; source "{ROOT}/slurm/common.sh"; {line}'
    clean = {k: v for k, v in worker_env().items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_gloo_interface_given_from_nccl_or_the_route_to_the_rendezvous_host():
    assert bash("pods_gloo_ifname 10.9.9.9", GLOO_SOCKET_IFNAME="eth7").stdout.strip() == "eth7"
    assert bash("pods_gloo_ifname 10.9.9.9", NCCL_SOCKET_IFNAME="ib0,ib1").stdout.strip() == "ib0,ib1"
    assert bash("pods_gloo_ifname 10.9.9.9", NCCL_SOCKET_IFNAME="=ib0").stdout.strip() == "ib0"
    assert bash("pods_gloo_ifname 127.0.0.1", NCCL_SOCKET_IFNAME="^docker").stdout.strip() == "lo"  # NCCL's exclusion: the route
    own = next((a for a in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split() if "." in a), None)
    if own is None:
        pytest.skip("no IPv4 address besides loopback here")
    dev = bash(f"pods_gloo_ifname {own}").stdout.strip()  # the rendezvous host itself: the interface holding it, not lo
    assert dev and dev != "lo" and own in subprocess.run(["ip", "-o", "addr", "show", "dev", dev], capture_output=True, text=True).stdout


def test_ranks_per_node_from_the_profile_and_never_more_than_the_gpus():
    run = f"PODS_PYTHON={sys.executable}; pods_nproc experiment=sparse_rl_qwen2_5_3b_rkv seed=1; echo NPROC=$NPROC"
    assert "NPROC=4" in bash(f"PODS_GPUS=8; {run}").stdout  # Sparse-RL's h100x4_zero2 on an 8-GPU node
    assert "NPROC=2" in bash(f"PODS_GPUS=8; {run}", PODS_NPROC="2").stdout  # named: as asked (pods.train checks it)
    p = bash(f"PODS_GPUS=2; {run}")
    assert p.returncode == 2 and "4 ranks per node but 2 GPU(s) visible" in p.stderr and "\nNPROC=" not in p.stdout
    assert (
        "NPROC=8"
        in bash(f"PODS_GPUS=8; PODS_PYTHON={sys.executable}; pods_nproc experiment=gsm8k_qwen3b_pods_h100x8; echo NPROC=$NPROC").stdout
    )
