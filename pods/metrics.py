"""Run logging: every row goes to ``metrics.jsonl`` in the run directory and, with ``logger.name=wandb``, to W&B
(``pods.wandb_log``: one W&B run per training run across resumes, eval metrics against training seconds, a table
of sampled completions per evaluation). Only the process that owns the run writes (``enabled``)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path


class MetricsLogger:
    """``resume_step``: the step of the checkpoint this start resumed from (None or 0: a fresh start). Rows
    logged after it by an earlier start are dropped from ``metrics.jsonl``; W&B continues the same run."""

    def __init__(self, run_dir: str | Path, cfg, enabled: bool = True, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.wandb = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():  # drop rows written after the checkpoint we resume from
            rows = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        if cfg.logger.name == "wandb":
            from pods.wandb_log import WandbRun

            history = read_metrics(self.path) if resume_step and self.path.exists() else []
            self.wandb = WandbRun(run_dir, cfg, resume_step, history)

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
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


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r.get("kind") == kind]
