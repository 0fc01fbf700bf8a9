"""A grading worker process (see pods.tasks.guard): read ``(index, pickled (fn, args))`` frames, answer
each with ``(index, "ok" | "error", value)``.

The address space is capped (``argv[1]`` MB) so a runaway sympy expression fails with MemoryError
instead of swapping the machine; the parent's deadline handles everything that merely runs long.
Stop signals meant for the training process (SIGUSR1/SIGUSR2/SIGINT) are ignored here: the pool starts the
worker with them blocked, and the first thing it does is ignore them, then unblock (a pending one is dropped).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys


def _read_exact(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def ignore_stop_signals(signals) -> None:
    """SIG_IGN for ``signals``, then unblock them (setting SIG_IGN discards one that arrived while blocked)."""
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def main() -> None:
    from pods.tasks.guard import STOP_SIGNALS

    ignore_stop_signals(STOP_SIGNALS)  # before anything slow: sympy's import takes seconds
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if memory_mb > 0:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = os.fdopen(os.dup(1), "wb", buffering=0)  # the protocol channel
    os.dup2(2, 1)  # stray prints from libraries go to stderr, not into the protocol
    stdin = os.fdopen(0, "rb", buffering=0)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs every inner failure

    from pods.tasks import graders
    from pods.tasks.guard import _HEADER, READY, frame

    graders.warm_up()  # import sympy/antlr and build the parser before the first deadline starts
    out.write(frame(READY))
    while True:
        header = _read_exact(stdin, _HEADER.size)
        if header is None:
            return
        (n,) = _HEADER.unpack(header)
        body = _read_exact(stdin, n)
        if body is None:
            return
        index, call = pickle.loads(body)
        try:
            fn, args = pickle.loads(call)  # inside the try: a function this process cannot import is an error reply
            reply = frame((index, "ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001 - model text must never take the worker down
            reply = frame((index, "error", f"{type(e).__name__}: {str(e)[:300]}"))
        out.write(reply)


if __name__ == "__main__":
    main()
