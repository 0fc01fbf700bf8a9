"""Run logging: every row goes to ``metrics.jsonl`` in the run directory and, with ``logger.name=wandb``,
to W&B under the same keys (online or offline). Only the process that owns the run writes."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLogger:
    def __init__(self, run_dir: Path, cfg: dict, enabled: bool = True, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.wandb = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():  # drop rows written after the checkpoint we resume from
            rows = [r for r in map(json.loads, self.path.read_text().splitlines()) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        lg = cfg["logger"]
        if lg.get("name") == "wandb":
            import wandb

            self.wandb = wandb.init(
                project=lg["project"],
                entity=lg["entity"],
                group=lg["group"],
                name=lg["run_name"],
                tags=list(lg["tags"]),
                mode=lg["mode"],
                dir=str(run_dir),
                config=cfg,
                resume="allow",
                id=lg["run_id"],
            )

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.wandb is not None:
            prefix = row.get("kind", "train")
            self.wandb.log(
                {f"{prefix}/{k}": v for k, v in clean.items() if isinstance(v, (int, float)) and v is not None}, step=row.get("step")
            )

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r.get("kind") == kind]
