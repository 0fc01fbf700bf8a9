"""A launch of another size than the profile is refused (issue 32 item 5): a 4-GPU recipe through the 8-GPU script ran
on 8 ranks and trained on twice its batch without a word. ``torchrun`` with 2 gloo ranks against a 1-rank profile: one
line, exit 2, before Hydra makes the run directory or anything loads (seconds: no rank gets to DeepSpeed)."""

from __future__ import annotations

import subprocess
import sys

from pods.errors import ConfigError
from pods.preflight import world_size
from pods.schema import Hardware
from support.config import ROOT
from support.harness import free_port, worker_env

LINE = (
    "pods: config error: launched as WORLD_SIZE=2 processes but hardware=cpu_ddp2_zero3 is written for "
    "hardware.nproc_per_node=1 x hardware.nnodes=1 = 1: start 1 (torchrun --nproc_per_node 1, PODS_NPROC=1)"
)


def test_two_ranks_against_a_one_rank_profile_are_refused_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    cmd += ["-m", "pods.train", "hardware=cpu_ddp2_zero3", "hardware.nproc_per_node=1", f"hydra.run.dir={tmp_path / 'run'}"]
    p = subprocess.run(cmd, cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert LINE in p.stderr and "(exitcode: 2)" in p.stderr, p.stderr[-3000:]  # torchrun stops the other rank at the first exit
    assert "/pods/" not in "".join(ln for ln in p.stderr.splitlines() if ln.lstrip().startswith("File ")), p.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_the_world_is_ranks_per_node_times_nodes_unless_the_check_is_off():
    hw = Hardware.of({"name": "h100x4_zero2", "nproc_per_node": 4})
    world_size(hw, {"WORLD_SIZE": "4"})
    world_size(hw, {})  # no launcher: pods.config's rule for several-GPU profiles decides
    try:
        world_size(hw, {"WORLD_SIZE": "8"})
        raise AssertionError("8 ranks for a 4-rank profile passed")
    except ConfigError as e:
        assert "WORLD_SIZE=8" in str(e) and "hardware.check_world_size=false" in str(e)
    world_size(Hardware.of({"name": "x", "nproc_per_node": 4, "nnodes": 2}), {"WORLD_SIZE": "8"})
    world_size(Hardware.of({"name": "x", "nproc_per_node": 4, "check_world_size": False}), {"WORLD_SIZE": "8"})
