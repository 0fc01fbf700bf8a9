"""The run's log: one ``logging`` logger tree under ``pods``, quiet on every rank but 0.

Under ``python -m pods.train`` Hydra configures the root logger (console + ``<run_dir>/train.log``), so every
``log.info`` lands in the run directory's ``train.log``. Called as a library (``pods.loop.train(cfg, dir)`` from a
test or a script) with no logging configured, ``setup`` gives ``pods`` a stderr handler of its own.
"""

from __future__ import annotations

import logging
import os

FORMAT = "[%(name)s] %(message)s"


def get(name: str = "pods") -> logging.Logger:
    """The logger of a module: ``get(__name__)`` (``pods.loop``, ...) or the package's own."""
    return logging.getLogger(name)


def setup(rank: int | None = None) -> logging.Logger:
    """The ``pods`` logger, ready: rank 0 logs INFO, other ranks only warnings and errors (``rank`` defaults to the
    environment's RANK). Where logging is configured (Hydra) records go to its handlers (``train.log``); where it is
    not, to stderr. Idempotent: call it where a run starts and before a library function's first message."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    log = logging.getLogger("pods")
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    own = [h for h in log.handlers if getattr(h, "_pods", False)]
    if logging.getLogger().handlers:  # configured (Hydra): propagate to the root's console and file handlers
        for h in own:
            log.removeHandler(h)
        log.propagate = True
    elif not own:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        handler._pods = True
        log.addHandler(handler)
        log.propagate = False
    return log
