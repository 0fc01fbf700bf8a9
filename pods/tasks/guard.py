"""Time limits for grading: a few worker processes, one call in flight each, a deadline per call.

Why processes and not math-verify's own timeouts: sympy can hang inside C code (a big-integer power,
a huge expansion) where a SIGALRM handler never runs, and signals only work in the main thread. A
worker past its deadline is killed (SIGKILL) and replaced; the call reports ``timeout``. Workers are
plain ``python -m pods.tasks.worker`` subprocesses speaking length-prefixed pickles over pipes, so the
parent's ``__main__`` (a Hydra train script, torch, CUDA) is never re-imported or forked.
Only functions importable by name can be sent (``sendable``); workers get this process's ``sys.path``.

Workers ignore SIGUSR1, SIGUSR2 and SIGINT (``STOP_SIGNALS``). Those ask the TRAINING process to checkpoint
(SLURM's ``scancel --signal=USR1`` and submitit's USR2 reach every process of the job step; Ctrl-C reaches the
terminal's process group), and their default action would kill a worker: its in-flight call would score 0 and
a worker being started would take the run down. They are blocked while a worker is spawned and stay blocked
in it until it has set them to SIG_IGN, so no signal can land in between.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

_HEADER = struct.Struct("<Q")
READY = "ready"
STOP_SIGNALS = frozenset({signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT})  # a worker ignores them (see above)


class Result(NamedTuple):
    status: str  # "ok" | "timeout" | "error"
    value: Any  # the return value, or an error message
    seconds: float


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class _Worker:
    def __init__(self, memory_mb: int):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the pods package
        env["PYTHONPATH"] = os.pathsep.join([root, *(p for p in sys.path if p)])  # what imports here imports there
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the child inherits the mask
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pods.tasks.worker", str(memory_mb)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                bufsize=0,
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a signal that came meanwhile is delivered here now
        self.fd = self.proc.stdout.fileno()
        self.buf = b""
        self.ready = False
        self.spawned = time.monotonic()
        self.task: int | None = None
        self.sent_at = 0.0

    def send(self, payload: bytes, task: int) -> None:
        self.task, self.sent_at = task, time.monotonic()
        self.proc.stdin.write(payload)

    def receive(self) -> list | None:
        """Messages that arrived; None when the worker has died (end of file)."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            return None
        self.buf += chunk
        out = []
        while len(self.buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(self.buf)
            if len(self.buf) < _HEADER.size + n:
                break
            out.append(pickle.loads(self.buf[_HEADER.size : _HEADER.size + n]))
            self.buf = self.buf[_HEADER.size + n :]
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class GradingPool:
    """``map(fn, items, timeout_s)`` runs ``fn(*item)`` for each item in a worker, under a deadline."""

    def __init__(self, workers: int = 2, memory_mb: int = 4096, startup_timeout_s: float = 120.0):
        self.n, self.memory_mb, self.startup_timeout_s = max(1, workers), memory_mb, startup_timeout_s
        self.pid = os.getpid()
        self.workers = [_Worker(memory_mb) for _ in range(self.n)]
        self.last_stats: dict = {}

    def _replace(self, i: int) -> None:
        self.workers[i].kill()
        self.workers[i] = _Worker(self.memory_mb)

    def map(self, fn: Callable, items: list[tuple], timeout_s: float) -> list[Result]:
        results: list[Result | None] = [None] * len(items)
        pending = deque(range(len(items)))
        restarts = 0
        while pending or any(w.task is not None for w in self.workers):
            for w in self.workers:
                if w.ready and w.task is None and pending:
                    i = pending.popleft()
                    try:
                        w.send(frame((i, pickle.dumps((fn, items[i]), protocol=pickle.HIGHEST_PROTOCOL))), i)
                    except (BrokenPipeError, OSError):
                        pending.appendleft(i)
                        w.ready = False  # noticed as dead on the next read
            now = time.monotonic()
            waits = [w.sent_at + timeout_s - now for w in self.workers if w.task is not None]
            waits += [w.spawned + self.startup_timeout_s - now for w in self.workers if not w.ready]
            poller = select.poll()  # not select.select: a big training process may hold fds beyond 1024
            for w in self.workers:
                poller.register(w.fd, select.POLLIN)
            readable = {fd for fd, _ in poller.poll(1000 * max(0.0, min(waits, default=1.0)))}
            for k, w in enumerate(self.workers):
                if w.fd not in readable:
                    continue
                messages = w.receive()
                if messages is None:  # died: out of memory, a crash in C code, killed from outside
                    if not w.ready:
                        raise RuntimeError(f"grading worker exited while starting (code {w.proc.wait()}); its error is above")
                    if w.task is not None:
                        results[w.task] = Result("error", "grading worker died", time.monotonic() - w.sent_at)
                    self._replace(k)
                    restarts += 1
                    continue
                for msg in messages:
                    if msg == READY:
                        w.ready = True
                    else:
                        i, status, value = msg
                        results[i] = Result(status, value, time.monotonic() - w.sent_at)
                        w.task = None
            now = time.monotonic()
            for k, w in enumerate(self.workers):
                if w.task is not None and now - w.sent_at > timeout_s:
                    results[w.task] = Result("timeout", f"timed out after {timeout_s:g}s", now - w.sent_at)
                    self._replace(k)
                    restarts += 1
                elif not w.ready and now - w.spawned > self.startup_timeout_s:
                    raise RuntimeError(f"grading worker did not start within {self.startup_timeout_s:g}s")
        self.last_stats = {
            "calls": len(items),
            "timeouts": sum(r.status == "timeout" for r in results),
            "errors": sum(r.status == "error" for r in results),
            "max_seconds": max((r.seconds for r in results), default=0.0),
            "restarts": restarts,
        }
        return results  # type: ignore[return-value]

    def close(self) -> None:
        if os.getpid() == self.pid:
            for w in self.workers:
                w.kill()
        self.workers = []


def sendable(fn: Callable) -> bool:
    """Whether a worker can import ``fn`` by name (module-level, not defined in ``__main__``)."""
    qualname = getattr(fn, "__qualname__", "")
    if getattr(fn, "__module__", "__main__") == "__main__" or "<" in qualname:
        return False
    try:
        pickle.dumps(fn)
    except Exception:  # noqa: BLE001
        return False
    return True


_POOLS: dict[int, GradingPool] = {}


def get_pool(workers: int | None = None) -> GradingPool:
    """A process-wide pool per worker count, started on first use and closed at exit."""
    n = workers or int(os.environ.get("PODS_GRADE_WORKERS", min(2, os.cpu_count() or 1)))
    pool = _POOLS.get(n)
    if pool is None or pool.pid != os.getpid():  # a forked child must not share its parent's workers
        pool = _POOLS[n] = GradingPool(n)
    return pool


@atexit.register
def _close_all() -> None:
    for pool in _POOLS.values():
        pool.close()
