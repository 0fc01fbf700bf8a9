"""``pods-eval --each-checkpoint RUN --launcher submitit`` on a GPU run asks SLURM for what the run's own profile says
(one GPU: an evaluation is one process; the profile's CPUs, memory, time) and evaluates on the run's device and
dtype; a sharded (DeepSpeed) checkpoint is left out up front, in one line, instead of a job that is then refused.

The command runs in-process (``support.doors``) with ``pods.launch.launch`` recording the jobs instead of submitting
them (the submission itself is tests/slurm/test_slurm_eval.py's, on a real local SLURM cluster); the resources are
what ``pods.launch``'s submitit launcher would hand submitit for each job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from support.doors import door

SUITE = ["--suite", "toy", "suite.only=[toy_arith]", "suite.samples=1"]


@pytest.fixture
def gpu_run(tmp_path) -> Path:
    """A run directory of an L40S LoRA run (its config.json as pods.train writes it): a plain checkpoint, a sharded one,
    final/. No weights are read: the jobs are only built."""
    from pods.compose import compose_plain

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000001.shards").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "final" / "adapter_config.json").write_text("{}")
    for name in ("step_000001.pt", "step_000002.pt"):
        (run / "checkpoints" / name).write_bytes(b"")
    (run / "config.json").write_text(json.dumps(compose_plain(["hardware=l40s_lora", "rollout=hf"])))
    return run


@pytest.fixture
def submitted(monkeypatch) -> list:
    """The jobs ``pods.launch.launch`` is handed, each reported finished."""
    import pods.launch

    jobs = []

    class Done:
        def wait(self) -> int:
            return 0

    def launch(given, launcher="local", **_):
        jobs.extend(given)
        return [Done() for _ in given]

    monkeypatch.setattr(pods.launch, "launch", launch)
    monkeypatch.setenv("GPU_PY", sys.executable)  # the GPU environment's python (here: this one)
    return jobs


def test_the_jobs_of_a_gpu_run_ask_for_its_profiles_gpu_and_run_on_its_device(gpu_run, submitted, tmp_path):
    from pods.launch import _resources

    p = door("pods.eval", ["--each-checkpoint", str(gpu_run), *SUITE, "--launcher", "submitit", "--out", str(tmp_path)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert [j.name for j in submitted] == ["eval-base", "eval-step_000002", "eval-final"]  # the start (step 0); the sharded step 1: no job
    assert "left out: step_000001.pt (sharded DeepSpeed checkpoints" in p.stderr
    for job in submitted:
        res = _resources(job)
        assert (res["gpus_per_node"], res["cpus_per_task"], res["mem_gb"], res["timeout_min"]) == (1, 8, 64, 480)  # l40s_lora's slurm block
        cmd = " ".join(job.cmd)
        assert "--device cuda --dtype bfloat16" in cmd and job.python == sys.executable


def test_given_device_and_dtype_win_and_only_sharded_checkpoints_are_one_line(gpu_run, submitted, tmp_path):
    p = door("pods.eval", ["--each-checkpoint", str(gpu_run), *SUITE, "--launcher", "submitit", "--device", "cuda:1", "--dtype", "float16"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert all("--device cuda:1 --dtype float16" in " ".join(j.cmd) for j in submitted)
    (gpu_run / "checkpoints" / "step_000002.shards").mkdir()
    (gpu_run / "final" / "adapter_config.json").unlink()
    p = door("pods.eval", ["--each-checkpoint", str(gpu_run), *SUITE, "--launcher", "submitit"])
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == (
        f"pods-eval: --each-checkpoint: {gpu_run} has no checkpoint pods-eval can load (only sharded (DeepSpeed) checkpoints and no final/)"
    )
