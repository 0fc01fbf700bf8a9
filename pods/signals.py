"""Stop requests from signals: SLURM's pre-emption/time-limit warning (SIGUSR1/SIGUSR2), SIGTERM, or Ctrl-C (SIGINT).

The handler only sets a flag; the loop notices it at the next step boundary, checkpoints, and then runs
any handler it displaced (e.g. submitit's SIGUSR2 handler, which requeues the job), so a requeued run
resumes from the checkpoint just written instead of the last periodic one. Ctrl-C is a stop request like SIGTERM
(Python's own handler, which would raise ``KeyboardInterrupt`` mid-step, is not run after the checkpoint); a second
Ctrl-C raises ``KeyboardInterrupt`` at once, without a checkpoint (``pods.train`` ends it in one line).
"""

from __future__ import annotations

import os
import signal

SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
NOTICE = b"pods: Ctrl-C: stopping after this step to write a checkpoint (Ctrl-C again: abort now, without one)\n"


class StopFlag:
    def __init__(self) -> None:
        self.requested = False
        self.by: str | None = None  # the first stop signal's name (SIGTERM, SIGINT, ...)
        self.interrupts = 0  # Ctrl-Cs so far
        self._deferred: list[tuple] = []
        self._previous: dict = {}

    def install(self) -> StopFlag:
        for sig in SIGNALS:
            try:
                previous = self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, lambda signum, frame, prev=previous: self._on_signal(signum, frame, prev))
            except ValueError:  # not the main thread (e.g. inside a test runner thread): no signals here
                pass
        return self

    def _on_signal(self, signum, frame, previous) -> None:
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts > 1:
                raise KeyboardInterrupt  # the second Ctrl-C: abort now
            os.write(2, NOTICE)  # a raw write: safe inside a handler that may interrupt a print
        self.requested = True
        self.by = self.by or signal.Signals(signum).name
        if callable(previous) and previous is not signal.default_int_handler:
            self._deferred.append((previous, signum, frame))

    def after_checkpoint(self) -> None:
        """Put the previous handlers back, then run those the signals would have run (they may exit the
        process, e.g. to requeue). A run stopped by Ctrl-C keeps Ctrl-C: another one while it ends (the end-of-run
        steps) ends it in one line with 130, not Python's traceback."""
        for sig, previous in self._previous.items():
            signal.signal(sig, _again if sig == signal.SIGINT and self.by == "SIGINT" else previous)
        deferred, self._deferred = self._deferred, []
        for handler, signum, frame in deferred:
            handler(signum, frame)


AGAIN = b"pods: interrupted (Ctrl-C) again after the checkpoint: ending now (the checkpoint is kept; train.resume=auto continues)\n"


def _again(signum, frame) -> None:
    """Ctrl-C once more after a Ctrl-C's checkpoint: end now, in one line, with the shell's Ctrl-C status."""
    os.write(2, AGAIN)
    raise SystemExit(130)
