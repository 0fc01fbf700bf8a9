"""What the benchmark scripts share: the repository on ``sys.path`` (they run as scripts, installed or not) and
the real config tree composed into the plain dict ``pods.loop.train`` takes (``pods.compose``). Importing this
module loads neither torch nor a model, so a script can set its thread count first."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pods.numerics import pin  # noqa: E402

pin()  # the CPU numerics (pods.numerics) before a benchmark loads torch: every script imports this module first


def compose(overrides: list[str] | None = None) -> dict:
    """``python -m pods.train <overrides>``'s resolved config, unchecked (``pods.compose.compose_plain``)."""
    from pods.compose import compose_plain

    return compose_plain(overrides)


def typed(overrides: list[str] | None = None):
    """The same config validated into the typed ``Root`` the package's functions take (``pods.schema.check``)."""
    from pods.schema import check

    return check(compose(overrides))


def short_run(steps: int, max_tokens: int) -> list[str]:
    """Overrides that make a config a seconds-long run: ``steps`` optimizer steps of 2 prompts, completions of
    ``max_tokens``, 8 eval prompts x 1 sample at the end only, no checkpoint, no logger."""
    return [
        f"train.max_steps={steps}", "train.time_budget_s=null", "train.prompts_per_step=2", "train.checkpoint_every_s=null",
        "train.checkpoint_at_end=false", "eval.max_examples=8", "eval.repeats=1", "eval.every_s=null", "eval.every_steps=null",
        f"sampling.max_tokens={max_tokens}", f"eval.max_tokens={max_tokens}", "logger=none",
    ]  # fmt: skip


def write_csv(rows: list[dict], path: Path) -> Path:
    """``rows`` (dicts with the same keys, the first row's order) as a CSV at ``path``; its folder made; the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path
