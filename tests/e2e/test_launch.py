"""pods.launch's local launcher with real ``python -m pods.train`` processes that end in seconds: ``--cfg job``
(prints the composed config, exit 0) and a bad override (one error line, exit 2, before any model loads).

What could fail: a run's ``launch.json`` says finished / failed as its process ended; a failed run stops the launch of
the runs after it; the log file gets the run's output; a finished run is reusable, a failed one and one whose launching process is gone are not."""

from __future__ import annotations

import json

import pytest

from pods import launch

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
