"""pods.launch's local launcher with real ``python -m pods.train`` processes that end in seconds: ``--cfg job``
(prints the composed config, exit 0) and a bad override (one error line, exit 2, before any model loads).

What could fail: a run's ``launch.json`` says finished / failed as its process ended; a failed run stops the launch of
the runs after it; the log file gets the run's output; a finished run is reusable, a failed one and one whose launching process is gone are not.
And the ``submitit`` launcher (plain submitit, no Hydra plug-in) with hydra-submitit-launcher hidden: a real 2-step
run through submitit's local executor writes its metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pods import launch
from pods.metrics import read_metrics
from support.plain_submitit import HIDDEN, submit_without_plugin

PRINT = ["--cfg", "job", "train.max_steps=3"]  # exits 0 after printing the config, nothing trained
BAD = ["algorithm.n=-1"]  # refused by the config checks: exit 2


def test_local_runs_in_parallel_and_marks_each_run(tmp_path, capsys):
    jobs = [launch.Job(PRINT, tmp_path / f"r{i}", log=tmp_path / f"r{i}.log", name=f"run {i}") for i in range(2)]
    assert launch.launch(jobs, "local", parallel=2, tag="t") == []
    for job in jobs:
        assert launch.status(job.run_dir)["status"] == "finished" and launch.reusable(job.run_dir)
        assert "max_steps: 3" in job.log.read_text()  # the run's own output went to its log
    out = capsys.readouterr().out
    assert out.count("[t] run ") == 2 and "load average" in out and f"hydra.run.dir={jobs[0].run_dir}" in out


def test_a_failed_run_stops_the_launch_of_the_rest(tmp_path):
    jobs = [launch.Job(BAD, tmp_path / "bad"), launch.Job(PRINT, tmp_path / "never")]
    with pytest.raises(SystemExit, match=r"a run failed: .*bad \(exit 2\)"):
        launch.launch(jobs, "local", parallel=1, tag="t")
    assert launch.status(tmp_path / "bad")["status"] == "failed" and not launch.reusable(tmp_path / "bad")
    assert launch.status(tmp_path / "never") is None


def test_a_launched_run_whose_process_is_gone_is_launched_again(tmp_path):
    launch.mark(tmp_path, "launched", "local", ["x"])
    assert launch.reusable(tmp_path)  # this process is alive
    state = json.loads((tmp_path / "launch.json").read_text())
    (tmp_path / "launch.json").write_text(json.dumps({**state, "pid": 2**22 + 1}))  # above Linux's pid_max default
    assert not launch.reusable(tmp_path)
    launch.mark(tmp_path, "launched", "slurm", ["x"])
    assert launch.reusable(tmp_path)  # a SLURM run belongs to its queue


def test_unknown_launcher_is_refused_with_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown launcher 'ssh'; valid: local, slurm"):
        launch.launch([launch.Job(PRINT, tmp_path)], "ssh")


@pytest.mark.slow  # a 2-step training run in submitit's job process (make test-all)
def test_plain_submitit_runs_a_job_without_hydra_submitit_launcher(tiny_dir, tmp_path):
    """``launch(..., "submitit")`` with PODS_SUBMITIT_CLUSTER=local: submitit's own local executor starts the job as a
    subprocess, the job runs ``pods.train``; no process of the tree can import hydra-submitit-launcher."""
    run_dir = tmp_path / "runs" / "plain"
    p = submit_without_plugin(run_dir, tmp_path, {**os.environ, "PODS_SUBMITIT_CLUSTER": "local"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "train")] == [1, 2]
    assert json.loads((run_dir / "config.json").read_text())["algorithm"]["n"] == 8
    assert launch.status(run_dir)["status"] == "finished" and launch.reusable(run_dir)
    (log,) = (tmp_path / "runs" / ".submitit").glob("*/*_0_log.out")  # the job's own log, written by submitit
    text = log.read_text()
    assert f"[pods] run directory: {run_dir}" in text and "Job completed successfully" in text
    assert HIDDEN in text  # the job's pods.train looked for Hydra plug-ins and found none


# ---- the python of a job (issue 32 item 3) ---------------------------------------------------------------------
GPU_RUN = ["experiment=gsm8k_qwen3b_pods_64_16_l40s", "--cfg", "job"]  # a 1-GPU profile (hardware.device=cuda)


def stand_in_python(tmp_path):
    """An executable that stands for the GPU environment's python: it records its arguments and exits 0 (no GPU here)."""
    path = tmp_path / "gpu-env" / "bin" / "python"
    path.parent.mkdir(parents=True)
    path.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "argv.txt"}\n')
    path.chmod(0o755)
    return path


def test_a_gpu_job_runs_with_the_gpu_python_and_a_cpu_job_with_this_one(tmp_path, monkeypatch):
    """make reproduce-figure-* runs pods.figures with the CPU .venv; a GPU profile's job must still start with the GPU
    environment's python (GPU_PY), the command built here without a GPU."""
    import sys

    gpu_py = stand_in_python(tmp_path)
    monkeypatch.setenv("GPU_PY", str(gpu_py))
    gpu, cpu = launch.Job(GPU_RUN, tmp_path / "gpu"), launch.Job(PRINT, tmp_path / "cpu", log=tmp_path / "cpu.log")
    assert launch.launch([gpu, cpu], "local", tag="t") == []
    assert launch.status(gpu.run_dir)["cmd"][:3] == [str(gpu_py), "-m", "pods.train"]
    assert (tmp_path / "argv.txt").read_text().split()[:3] == ["-m", "pods.train", "experiment=gsm8k_qwen3b_pods_64_16_l40s"]
    assert launch.status(cpu.run_dir)["cmd"][0] == sys.executable and "max_steps: 3" in cpu.log.read_text()


def test_a_gpu_job_without_a_gpu_python_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GPU_PY", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    jobs = [launch.Job(PRINT, tmp_path / "cpu"), launch.Job(GPU_RUN, tmp_path / "gpu")]
    with pytest.raises(SystemExit) as e:
        launch.launch(jobs, "local", tag="t")
    assert e.value.code == 2 and "pods: config error: GPU jobs need the GPU environment's python" in capsys.readouterr().err
    assert launch.status(tmp_path / "cpu") is None and launch.status(tmp_path / "gpu") is None  # nothing started


def test_a_several_gpu_job_asks_sbatch_for_its_profiles_gpus_and_time():
    """A 4-GPU recipe through the 8-GPU script: 4 GPUs and its 48 h (hardware.slurm.timeout_min), not the script's 8 and 2 h."""
    job = launch.Job(["experiment=sparse_rl_qwen2_5_3b_rkv"], Path("unused"), nproc=4)
    assert launch._sbatch_resources(job) == ["--gpus-per-node=4", "--time=2880"]
    job = launch.Job(["experiment=gsm8k_qwen3b_pods_h100x8"], Path("unused"), nproc=8)
    assert launch._sbatch_resources(job) == ["--gpus-per-node=8", "--time=120"]
