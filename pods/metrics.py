"""Run logging: every row goes to ``metrics.jsonl`` in the run directory and, with ``logger.name=wandb``, to W&B
(``pods.wandb_log``: one W&B run per training run across resumes, eval metrics against training seconds, a table
of sampled completions per evaluation). Only the process that owns the run writes (``enabled``)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

from pods.files import atomic
from pods.log import get


class MetricsLogger:
    """``resume_step``: the step of the checkpoint this start resumed from (0: a resume that found none and starts the
    run again; None: no resume). Rows logged after it by an earlier start are dropped from ``metrics.jsonl`` (0: all
    of them), and so is a last row cut short by a kill mid-write; W&B continues the same run. Each row is appended
    whole (``append``)."""

    def __init__(self, run_dir: str | Path, cfg, enabled: bool = True, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.wandb = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            keep(self.path, resume_step)
        if cfg.logger.name == "wandb":
            from pods.wandb_log import WandbRun

            history = read_metrics(self.path) if resume_step and self.path.exists() else []
            self.wandb = WandbRun(run_dir, cfg, resume_step, history)

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        append(self.path, json.dumps(clean) + "\n")
        if self.wandb is not None:
            self.wandb.log(clean)

    def log_completions(self, rows: list[dict]) -> None:
        """Sampled completions of the evaluation under way (dicts with ``prompt``, ``completion``, ``gold``,
        ``reward``, ``correct``, ``formatted``): W&B shows a few as a table with the next eval row."""
        if self.wandb is not None:
            self.wandb.keep_completions(rows)

    def completion_sink(self, tok) -> Callable | None:
        """What ``evaluate(..., on_samples=...)`` calls with its ``Rollouts``, golds and scores: a few completions
        decoded with ``tok`` for the W&B table; None (nothing to collect) without W&B."""
        if self.wandb is None or not self.wandb.limit:
            return None
        from pods.wandb_log import completion_sink

        return completion_sink(self.wandb, tok)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None


def lines(path: str | Path) -> tuple[list[str], str]:
    """The whole lines of a metrics file (each ending in a newline) and what follows the last one: a row cut short by
    a kill mid-write ('' when none)."""
    text = Path(path).read_text()
    whole, _, partial = text.rpartition("\n")
    return ([line + "\n" for line in whole.split("\n")] if whole or text.startswith("\n") else []), partial


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict]:
    """The rows of a metrics file (of ``kind``); a last line cut short by a kill mid-write is dropped with a warning,
    any other line that is not a JSON row is a ``ConfigError`` naming it."""
    from pods.errors import ConfigError

    whole, partial = lines(path)
    if partial.strip():
        get(__name__).warning(f"{path}: dropped its last line, cut short mid-write ({len(partial)} characters)")
    rows = []
    for i, line in enumerate(whole, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            raise ConfigError(f"{path}: line {i} is not a JSON row: not a metrics file of pods, or edited") from None
    return [r for r in rows if kind is None or r.get("kind") == kind]


def keep(path: Path, step: int) -> None:
    """On resume from the checkpoint of ``step`` (0: a fresh start): only the rows logged up to it stay, byte for byte
    (a row cut short mid-write goes too); the file is replaced whole (a kill now leaves the old or the new one)."""
    whole, partial = lines(path)
    rows = read_metrics(path)  # warns about a cut row; refuses a file that is not ours
    kept = [line for line, r in zip([w for w in whole if w.strip()], rows) if step and r.get("step", 0) <= step]
    if len(kept) == len(rows) and not partial and len(whole) == len(kept):
        return  # nothing to drop: the file is left as it is
    with atomic(path) as f:
        f.write("".join(kept))


def append(path: Path, text: str) -> None:
    """One row, whole: one write to the end of the file, flushed to the OS before the next row."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
