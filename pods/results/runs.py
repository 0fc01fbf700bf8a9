"""Finished (or running) runs as data: the one reader of a run directory's ``config.json`` + ``metrics.jsonl``.

A ``Run`` holds its eval rows, its train rows and its config (``None`` when the directory has no config.json).
``find_runs`` lists the run directories under a root: the ones its ``runs.json`` lists (a figure's own list, see
``record``), else every directory below it with both files. ``group`` labels runs by a ``LABELS`` entry.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from pods.metrics import read_metrics
from pods.registry import Registry

X = {"time": "train_time", "step": "step"}  # a curve's x axis: training seconds (evaluation excluded) or optimizer steps


@dataclass
class Run:
    """One run: ``evals`` and ``train`` are its metrics.jsonl rows of that kind, in order."""

    run_dir: str
    evals: list[dict]
    train: list[dict] = field(default_factory=list)
    config: dict | None = None

    def curve(self, x: str = "time", y: str = "accuracy", kind: str = "eval") -> tuple[np.ndarray, np.ndarray]:
        """(xs [K], ys [K]), xs ascending: ``y`` of the ``kind`` rows against ``x`` (``time`` or ``step``). One point
        per x, the last row's (a resumed run repeats its final evaluation); rows without ``y`` are left out."""
        pts = {float(r[X[x]]): float(r[y]) for r in (self.evals if kind == "eval" else self.train) if r.get(y) is not None}
        xs = np.array(sorted(pts))
        return xs, np.array([pts[k] for k in xs])

    @property
    def algorithm(self) -> dict:
        return (self.config or {}).get("algorithm", {})

    @property
    def n_eval(self) -> int:
        """Samples behind the first evaluation (its binomial noise when there is a single seed); 0 when unknown."""
        return (self.evals[0].get("n_eval") or 0) if self.evals else 0

    @cached_property
    def costs(self) -> dict:
        """Steps and training seconds at the end, and per step: the median seconds, the mean share of prompt groups
        with zero reward variance, the medians of generation and update seconds (NaN without train rows)."""
        nan = float("nan")
        if not self.train:
            return {"steps": 0, "train_time": 0.0, "s_per_step": nan, "zero_var": nan, "t_generate": nan, "t_update": nan}
        times = [0.0] + [r["train_time"] for r in self.train]

        def med(k: str) -> float:
            return statistics.median(r[k] for r in self.train if r.get(k) is not None)

        return {
            "steps": self.train[-1]["step"],
            "train_time": self.train[-1]["train_time"],
            "s_per_step": statistics.median(b - a for a, b in zip(times, times[1:])),
            "zero_var": statistics.fmean(r["zero_var_groups"] for r in self.train),
            "t_generate": med("t_generate"),
            "t_update": med("t_update"),
        }


def load_run(run_dir: str | Path) -> Run:
    """Read ``run_dir/metrics.jsonl`` (and ``config.json`` when there is one)."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    starts = sum(r.get("kind") == "setup" for r in rows)  # one per run: a resume keeps the first start's row
    if starts > 1:
        from pods.log import get

        get(__name__).warning(
            f"{run_dir / 'metrics.jsonl'} holds the rows of {starts} runs ({starts} setup rows), appended into one directory "
            "before pods refused a second run there: its curves mix them; split the file or train that run again"
        )
    cfg = run_dir / "config.json"
    return Run(
        str(run_dir),
        [r for r in rows if r.get("kind") == "eval"],
        [r for r in rows if r.get("kind") == "train"],
        json.loads(cfg.read_text()) if cfg.exists() else None,
    )


def find_runs(root: str | Path) -> list[Path]:
    """The run directories ``root/runs.json`` lists (in its order), else every directory under ``root`` (any depth,
    sorted) with a config.json; either way only those that have both config.json and metrics.jsonl yet."""
    root = Path(root)
    dirs = listed(root) or [p.parent for p in sorted(root.rglob("config.json"))]
    return [d for d in dirs if (d / "config.json").exists() and (d / "metrics.jsonl").exists()]


def group(runs: list[Run], label: Callable[[dict], str]) -> dict[str, list[Run]]:
    """Runs by ``label(algorithm settings)``, labels and runs in the order first seen."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(label(r.algorithm), []).append(r)
    return out


def record(fig_dir: Path, job: list[str], run_dir: Path) -> None:
    """Add ``job -> run_dir`` to a figure's ``runs.json`` (its runs may live elsewhere, shared with other figures)."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    path = fig_dir / "runs.json"
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[" ".join(job)] = str(run_dir)
    path.write_text(json.dumps(runs, indent=1, sort_keys=True))


def listed(fig_dir: str | Path) -> list[Path]:
    """The run directories a figure's ``runs.json`` lists (none when there is no list)."""
    path = Path(fig_dir) / "runs.json"
    return [Path(p) for p in json.loads(path.read_text()).values()] if path.exists() else []


# ---- labels: a curve's name from a run's algorithm settings ---------------------------------------------------
LABELS = Registry("run label")
NAMES = {"grpo": "GRPO", "grpo_pods": "PODS", "d3s": "D3S-I", "d3s_cross": "D3S-C"}


@LABELS.register("arm")
def arm(a: dict) -> str:
    """GRPO n/m, GRPO-GA n/m, or PODS n->m (and the rule when it is not max-variance)."""
    if a.get("grad_accum"):
        return f"GRPO-GA {a['n']}/{a['m']}"
    if a["rule"] == "all" or a["n"] == a["m"]:  # every rollout kept: GRPO, whatever the rule
        return f"GRPO {a['n']}/{a['m']}"
    return f"PODS {a['n']}→{a['m']}" + ("" if a["rule"] == "max_variance" else f" {a['rule']}")


@LABELS.register("rule")
def by_rule(a: dict) -> str:
    """The down-sampling rule alone: max-variance, max-reward, random."""
    return a["rule"].replace("_", "-")


@LABELS.register("d3s")
def d3s(a: dict) -> str:
    """GRPO 16/16, PODS 64->16, D3S-I 16->4..8 (kept per group at p = 0 .. p = 1)."""
    name = NAMES.get(a["name"], a["name"])
    if a["rule"] == "all":
        return f"{name} {a['n']}/{a['m']}"
    span = f"{a['m']}..{a['m_final']}" if a.get("m_final") else f"{a['m']}"
    return f"{name} {a['n']}→{span}"
