"""A command-line door run in-process: ``door("pods.grade", [...])`` is ``python -m pods.grade ...`` without the
new interpreter (about 8 s of torch and transformers imports each): the entry point's ``main(argv)``, its exit code
(``sys.exit``'s or the returned one, as the module's ``__main__`` passes it on), and what it printed.

Each call leaves this process as it found it: ``sys.argv``, the working directory, the environment, Hydra's global
state, the logging handlers a run adds (Hydra's console and ``train.log`` handlers, ``pods.log``'s own; during the
call the root logger has no handler, as in a new interpreter, not pytest's capturing one), torch's
thread count, the RNG states and the signal handlers. One real-process test per entry point stays (``python(...)``
in ``support/runs.py``, ``subprocess`` in the test files): this helper is for the fast tier's many cases.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import os
import random
import runpy
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from support.config import ROOT

# ``python -m NAME`` -> the function its ``__main__`` calls with the command's arguments
MAINS = {
    "pods.train": "pods.train:main",
    "pods.eval": "pods.eval.cli:main",
    "pods.eval.cli": "pods.eval.cli:main",
    "pods.export": "pods.export:main",
    "pods.grade": "pods.grade:main",
    "pods.memory": "pods.memory.report:main",
    "pods.figures": "pods.figures:main",
    "pods.demo": "pods.demo:main",
    "pods.results.d3s": "pods.results.d3s:main",
    "pods.results.d3s_mixed": "pods.results.d3s_mixed:main",
}
PACKAGES = ("pods.eval", "pods.memory")  # run by their __main__.py
DROPPED = ("pods.train", "pods.figures", "pods.demo", "pods.results.d3s", "pods.results.d3s_mixed")  # __main__: main(), no exit code
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


@dataclass
class Ran:
    """What a door left: the exit code and the text it printed (``subprocess.CompletedProcess``'s names)."""

    returncode: int
    stdout: str
    stderr: str


def exit_code(value) -> int:
    """The status ``sys.exit(value)`` ends a process with (None: 0, an int: itself, anything else: 1)."""
    if value is None or isinstance(value, bool):
        return int(bool(value))
    return value if isinstance(value, int) else 1


def door(command: str | Path, args: list, cwd: Path | str = ROOT, env: dict | None = None) -> Ran:
    """Run ``python -m COMMAND ARGS`` (``COMMAND`` a ``MAINS`` name) or ``python SCRIPT ARGS`` (a ``.py`` path) here,
    in ``cwd`` with ``env`` added to the environment (a None value: unset); an exception other than ``SystemExit`` propagates (where the
    process would have printed a traceback)."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with restored(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for k, v in (env or {}).items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, str(v))
        os.chdir(cwd)
        try:
            if str(command).endswith(".py"):
                sys.argv = [str(command), *argv]
                runpy.run_path(str(command), run_name="__main__")
                code = 0
            else:
                module, name = MAINS[str(command)].split(":")
                sys.argv = [importlib.util.find_spec(f"{command}.__main__" if command in PACKAGES else command).origin, *argv]
                returned = getattr(importlib.import_module(module), name)(argv)
                code = 0 if command in DROPPED else exit_code(returned)
        except SystemExit as e:
            code = exit_code(e.code)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)  # what the interpreter prints for sys.exit("message")
    return Ran(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def restored():
    """Put back what a door changes in this process (see the module docstring)."""
    from hydra.core.global_hydra import GlobalHydra

    argv, cwd, environ = list(sys.argv), os.getcwd(), dict(os.environ)
    loggers = {name: _logger_state(lg) for name, lg in _loggers()}
    threads, rng = torch.get_num_threads(), (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    handlers = {s: signal.getsignal(s) for s in SIGNALS}
    GlobalHydra.instance().clear()
    root = logging.getLogger()  # as in a fresh interpreter: no root handler (not pytest's), so what nothing configured
    root.handlers[:] = []  # reaches stderr (logging's last resort) and pods.log gives itself a stderr handler
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        sys.argv = argv
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        for name, lg in _loggers():
            _restore_logger(lg, loggers.get(name))
        torch.set_num_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.random.set_rng_state(rng[2])
        for s, h in handlers.items():
            signal.signal(s, h)


def _loggers():
    yield "", logging.getLogger()
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger):
            yield name, lg


def _logger_state(lg: logging.Logger) -> tuple:
    return list(lg.handlers), lg.level, lg.propagate, lg.disabled


def _restore_logger(lg: logging.Logger, state: tuple | None) -> None:
    """The logger's handlers, level and switches as they were; a handler the door added is closed (a ``train.log``)."""
    before, level, propagate, disabled = state or ([], logging.NOTSET, True, False)
    for h in lg.handlers:
        if h not in before:
            h.close()
    lg.handlers[:] = before
    lg.setLevel(level)
    lg.propagate, lg.disabled = propagate, disabled
