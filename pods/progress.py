"""Progress bars that stay readable in log files.

On a terminal ``bar`` is a plain ``tqdm`` bar, redrawn in place. Anywhere else (a SLURM log, ``make demo > log``,
a pipe) a redraw is a carriage return plus a whole new copy of the bar, and ``set_postfix`` redraws on every step:
an 800-step loop wrote thousands of copies into one line of the log. There ``bar`` writes whole lines instead: one
every ``every_s`` seconds while it runs (none for a bar that ends sooner) and, for a bar that is left, the final
count, so a log grows by a bounded number of lines however many steps run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

from tqdm import tqdm

EVERY_S = 30.0  # off a terminal: one line per this many seconds at most


class LineBar(tqdm):
    """A ``tqdm`` bar that writes one whole line per refresh, the first ``every_s`` seconds after it starts and then
    at most one every ``every_s`` seconds; never a carriage return (a line is the bar as tqdm formats it: count,
    rate, postfix)."""

    def __init__(self, *args, every_s: float = EVERY_S, **kwargs):
        self.every_s, self._last_line, self._line_n = every_s, time.monotonic(), None  # tqdm's first refresh is skipped
        super().__init__(*args, **kwargs)

    def refresh(self, nolock: bool = False, lock_args=None) -> bool:
        now = time.monotonic()
        if now - self._last_line < self.every_s:
            return False
        self._last_line = now
        return super().refresh(nolock=nolock, lock_args=lock_args)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg == "":  # tqdm clearing its line: nothing to clear in a log
            return False
        self.fp.write((self.__str__() if msg is None else msg).strip() + "\n")
        self._line_n = self.n
        self.fp.flush()
        return True

    def clear(self, nolock: bool = False) -> None:
        """No line to clear (``tqdm.write`` clears bars before it prints)."""

    def close(self) -> None:
        left = self.leave if self.leave is not None else self.pos == 0
        if not self.disable and left and self._line_n != self.n:  # the final count, unless the last line showed it
            self._last_line = float("-inf")
            self.refresh()
        self.leave = False  # tqdm's own close would clear, then write a newline
        super().close()


def on_terminal(file) -> bool:
    """Whether ``file`` is a terminal (a log file, a pipe or a closed stream is not)."""
    isatty = getattr(file, "isatty", None)
    return bool(isatty and isatty())


def bar(
    iterable: Iterable | None = None,
    *,
    desc: str | None = None,
    total: float | None = None,
    disable: bool = False,
    file=None,
    every_s: float = EVERY_S,
    **kwargs,
) -> tqdm:
    """A progress bar over ``iterable`` (or updated by hand up to ``total``) on ``file`` (default stderr).

    A terminal gets ``tqdm(iterable, desc=..., total=..., **kwargs)``; elsewhere a ``LineBar`` writing one line every
    ``every_s`` seconds at most. ``disable=True`` shows nothing (e.g. ranks other than 0)."""
    file = sys.stderr if file is None else file
    if on_terminal(file):
        return tqdm(iterable, desc=desc, total=total, disable=disable, file=file, **kwargs)
    kwargs.pop("dynamic_ncols", None)  # no terminal to measure
    # LineBar times its own lines; tqdm's intervals only bound how often it looks at the clock
    kwargs.update(mininterval=min(every_s, 1.0), maxinterval=max(every_s, 10.0))
    return LineBar(iterable, desc=desc, total=total, disable=disable, file=file, every_s=every_s, **kwargs)
