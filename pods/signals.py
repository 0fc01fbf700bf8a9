"""Stop requests from signals: SLURM's pre-emption/time-limit warning (SIGUSR1/SIGUSR2) or SIGTERM.

The handler only sets a flag; the loop notices it at the next step boundary, checkpoints, and then runs
any handler it displaced (e.g. submitit's SIGUSR2 handler, which requeues the job), so a requeued run
resumes from the checkpoint just written instead of the last periodic one.
"""

from __future__ import annotations

import signal

SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


class StopFlag:
    def __init__(self) -> None:
        self.requested = False
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
        self.requested = True
        if callable(previous):
            self._deferred.append((previous, signum, frame))

    def after_checkpoint(self) -> None:
        """Put the previous handlers back, then run those the signals would have run (they may exit the
        process, e.g. to requeue)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        deferred, self._deferred = self._deferred, []
        for handler, signum, frame in deferred:
            handler(signum, frame)
