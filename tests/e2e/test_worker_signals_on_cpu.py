"""Grading workers survive the stop signals meant for the training process.

SLURM's ``scancel --signal=USR1``, submitit's USR2 and a terminal's Ctrl-C (SIGINT) reach every process of the
job step or process group, the grading workers included. A real process (its own process group) installs
handlers as the training loop does, starts a real GradingPool and grades; the test signals the WHOLE group
(``os.killpg``) again and again, while the workers start (importing sympy) and while calls are in flight.
Every call must come back "ok" with no worker restarted. A bystander child with default dispositions in the
same group shows that the signals really reach the group's other processes (it dies of them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from support.config import ROOT

CHILD = r"""
import json, signal, subprocess, sys, time
from pods.tasks.guard import GradingPool

caught = []
for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
    signal.signal(sig, lambda signum, frame: caught.append(signum))  # as pods.signals.StopFlag: note it, carry on
bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # default dispositions
print("grading", flush=True)
pool = GradingPool(workers=2, startup_timeout_s=300)
slow = pool.map(time.sleep, [(0.4,)] * 8, timeout_s=60)  # calls in flight while the group is signalled
stats = dict(pool.last_stats)
values = pool.map(pow, [(2, k) for k in range(6)], timeout_s=60)
pool.close()
bystander.wait(timeout=60)
for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)  # Python's shutdown puts SIG_DFL back for handled signals: not under test
print(json.dumps({
    "slow": [r.status for r in slow], "values": [r.value for r in values], "statuses": [r.status for r in values],
    "restarts": stats["restarts"], "caught": sorted(set(caught)), "bystander": bystander.returncode,
}), flush=True)
"""

SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)


def test_grading_workers_ignore_stop_signals_sent_to_the_whole_process_group(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        assert p.stdout.readline().strip() == "grading", p.stderr.read()
        sent, deadline = 0, time.time() + 300  # generous: worker start-up imports sympy on a shared 2-core machine
        while p.poll() is None and time.time() < deadline:
            os.killpg(p.pid, SIGNALS[sent % len(SIGNALS)])  # the group: the process, its workers, the bystander
            sent += 1
            time.sleep(0.05)
        out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert sent >= 20, sent  # the signals kept coming through start-up and grading (one per 50 ms)
    assert result["bystander"] in [-s for s in SIGNALS]  # a default process in the group was killed by them
    assert result["caught"] == sorted(int(s) for s in SIGNALS)  # the training process saw all three
    assert result["slow"] == ["ok"] * 8 and result["restarts"] == 0  # no call lost, no worker replaced
    assert result["statuses"] == ["ok"] * 6 and result["values"] == [2**k for k in range(6)]
