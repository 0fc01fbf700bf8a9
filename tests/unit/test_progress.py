"""pods.progress: a bar redrawn in place on a terminal, a bounded number of whole lines in a log file."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

from tqdm import tqdm

from pods.progress import LineBar, bar
from support.harness import ROOT, worker_env

STEPS, EVERY_S = 1500, 0.25
LOOP = """
import time
from {module} import {name} as bar
start = time.monotonic()
b = bar(total={steps}, desc="steps"{extra})
for i in range({steps}):
    time.sleep(0.001)
    b.update(1)
    b.set_postfix(i=i)  # tqdm redraws on every call
    if i % 500 == 499:
        b.write(f"note {{i}}")
b.close()
print(f"elapsed {{time.monotonic() - start}}")
"""


def _log_of(tmp_path, module: str, name: str, extra: str = "") -> tuple[str, float]:
    """Run the 1500-step loop with stdout and stderr into a file (no terminal); (the log, the loop's seconds)."""
    log = tmp_path / f"{name}.log"
    with log.open("w") as f:
        code = LOOP.format(module=module, name=name, extra=extra, steps=STEPS)
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=worker_env(), stdout=f, stderr=f, check=True, timeout=120)
    text = log.read_bytes().decode()  # as written: read_text would turn carriage returns into newlines
    return text, float(text.rsplit("elapsed ", 1)[1])


def test_off_a_terminal_a_log_gets_one_line_per_interval(tmp_path):
    """Plain tqdm writes a carriage-return redraw per step into the file; ``bar`` writes at most one line per
    EVERY_S seconds while it runs plus the final count, and ``write``'s lines come through whole."""
    plain, _ = _log_of(tmp_path, "tqdm", "tqdm")
    assert plain.count("\r") >= STEPS  # the problem: one redraw per set_postfix
    text, elapsed = _log_of(tmp_path, "pods.progress", "bar", f", every_s={EVERY_S}")
    lines = text.splitlines()
    bars = [ln for ln in lines if ln.startswith("steps")]
    assert "\r" not in text and [ln for ln in lines if ln.startswith("note")] == ["note 499", "note 999", "note 1499"]
    assert len(bars) <= int(elapsed / EVERY_S) + 1, (len(bars), elapsed)  # one per EVERY_S after the start, + the final
    assert len(bars) >= 2 and f"{STEPS}/{STEPS}" in bars[-1] and f"{STEPS}/{STEPS}" not in bars[-2]
    counts = [re.search(rf"(\d+)/{STEPS}", ln).group(1) for ln in bars]
    assert len(set(counts)) == len(counts)  # no count written twice (the final line only when it is new)
    assert len(lines) == len(bars) + 3 + 1  # + notes + the elapsed line: nothing else


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except OSError:  # the terminal's other end is closed and all was read
        return b""


def test_on_a_terminal_it_is_tqdm_redrawn_in_place():
    """A real pseudo-terminal: the plain tqdm bar, redrawn with carriage returns."""
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w") as term:
            b = bar(total=3, desc="steps", file=term)
            assert type(b) is tqdm
            for i in range(3):
                b.update(1)
                b.set_postfix(i=i)  # a redraw each
            b.close()
        out = b""
        while chunk := _read(master):
            out += chunk
    finally:
        os.close(master)
    assert out.count(b"\r") >= 4 and b"3/3" in out


def test_disabled_and_short_bars_write_nothing(tmp_path):
    """``disable=True`` (ranks other than 0) writes nothing; neither does a bar that is not left and ends within
    its first interval (the per-step inner bars); a bar that is left writes its final count, once."""
    log = tmp_path / "log"
    with log.open("w") as f:
        assert sum(bar(range(5), disable=True, file=f)) == 10
        assert list(bar(range(3), leave=False, file=f, mininterval=2.0, dynamic_ncols=True)) == [0, 1, 2]  # terminal options pass
        left = bar(range(4), desc="left", file=f)
        assert isinstance(left, LineBar) and list(left) == [0, 1, 2, 3]
    (line,) = log.read_bytes().decode().split("\n")[:-1]
    assert line.startswith("left") and "4/4" in line
