"""Ctrl-C through the command a user types (``python -m pods.train``, a real process: the signal is the test): the
first SIGINT is a stop request like SIGTERM (a checkpoint after the step under way, then the same last line, which
names the checkpoint and how to continue); a second SIGINT aborts at once in one line. Both with the HF engine and
with a launched ``vllm_server`` (its server gone after, its log in the run directory). It used to print a 43-108 line
``KeyboardInterrupt`` traceback and write no checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.config import ROOT
from support.harness import needs_vllm_kernels, worker_env
from support.runs import TINY_STEPS

pytestmark = pytest.mark.slow

RUN = [*TINY_STEPS, "train.prompts_per_step=1", "train.max_steps=1000", "eval.at_start=false"]
SERVER = [
    "rollout=vllm_server",
    "rollout.kv_cache_gib=0.0625",
    "rollout.max_model_len=256",
    "rollout.servers=1",
    "rollout.devices=[0]",
]


def train_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == "train"]


def interrupted(tmp_path: Path, signals: list[int], *extra: str) -> tuple[int, str, str]:
    """Start a run, send ``signals`` (0.2 s apart) once it logged a step; (exit code, stdout, stderr)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pods.train", *RUN, *extra, f"hydra.run.dir={run_dir}"]
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        p = subprocess.Popen(cmd, cwd=ROOT, env=worker_env(), stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 540
            while not train_rows(run_dir / "metrics.jsonl"):
                assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()[-3000:]
                time.sleep(0.2)
            for sig in signals:
                p.send_signal(sig)
                time.sleep(0.2)
            rc = p.wait(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
    return rc, (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_ctrl_c_checkpoints_and_ends_like_sigterm(tiny_dir, tmp_path, sig):
    rc, out, err = interrupted(tmp_path, [sig])
    run_dir = tmp_path / "run"
    kept = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert rc == (130 if sig == signal.SIGINT else 0), err[-3000:]
    line = last_line(out)
    assert line == (
        f"[pods] stopped by {signal.Signals(sig).name}: {run_dir} keeps {kept}: the same command with "
        f"hydra.run.dir={run_dir} train.resume=auto continues from it"
    ), out[-2000:]
    assert int(kept[5:11]) == max(r["step"] for r in train_rows(run_dir / "metrics.jsonl"))  # the step under way, saved


def test_a_second_ctrl_c_aborts_at_once_in_one_line(tiny_dir, tmp_path):
    rc, out, err = interrupted(tmp_path, [signal.SIGINT, signal.SIGINT])
    assert rc == 130 and "Traceback" not in err, err[-3000:]
    aborted = last_line(err).startswith(  # mid-step: no checkpoint; or, on a fast step, after the first one's checkpoint
        ("pods: interrupted (Ctrl-C): no checkpoint written now; ", "pods: interrupted (Ctrl-C) again after the checkpoint")
    )
    ended = last_line(out).startswith(f"[pods] stopped by SIGINT: {tmp_path / 'run'} keeps step_")  # or it had ended already
    assert aborted or ended, err[-3000:] + out[-2000:]


@needs_vllm_kernels
def test_ctrl_c_with_a_launched_vllm_server_checkpoints_stops_the_server_and_keeps_its_log(tiny_dir, tmp_path):
    rc, out, err = interrupted(tmp_path, [signal.SIGINT], *SERVER)
    run_dir = tmp_path / "run"
    assert rc == 130 and "Traceback" not in err, err[-3000:]
    assert last_line(out).startswith(f"[pods] stopped by SIGINT: {run_dir} keeps step_"), out[-2000:]
    assert (run_dir / "checkpoints" / "latest").is_file()
    log = run_dir / "vllm_server" / "server-0.log"  # it used to be a pods-vllm-server-* folder of the system temp dir
    assert log.is_file() and log.stat().st_size > 0
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(run_dir) not in ps and "vllm" not in " ".join(a for a in ps.splitlines() if os.fspath(tiny_dir) in a)
