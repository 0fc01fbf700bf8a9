"""``train.resume`` is exact or refused, decided before anything loads from the run's own record: its config.json
and metrics.jsonl (``check``).

- This command's settings differ from the run's in anything that changes what it computes: ``ConfigError`` in one
  line naming the keys; nothing is written (config.json keeps the run's settings).
- ``auto`` on a run that already reached this command's horizon and ended (its end-of-run evaluation follows its last
  step, its end-of-run files are there): the run is finished; ``check`` returns that evaluation and nothing runs.
- ``auto`` on a run that ended under a shorter horizon: it continues from its final checkpoint (a larger
  ``train.max_steps`` or ``train.time_budget_s`` extends a run on purpose); one whose checkpoints were deleted at its
  end (``train.checkpoint_at_end`` weights/false) cannot continue: refused.
- ``auto`` on a run that trained steps but holds no checkpoint: ``ConfigError`` (starting at step 0 would drop its rows);
  a run that logged only its start begins again as it did.
- Otherwise the loop resumes from the latest checkpoint (or, with none, starts the run again).
- No ``train.resume`` (a fresh run) into a directory that holds a run (``RECORD``): ``ConfigError`` in one line naming
  ``train.resume=auto`` and another directory (``fresh``); with ``train.start_over=true`` the old run is moved aside to
  ``<dir>.old<k>`` (``aside``), never deleted. Hydra's own files (.hydra/, train.log) are not a run.

What may differ on resume (``MAY_CHANGE``): the horizon (``train.max_steps``, ``train.time_budget_s``: a larger one
extends the run, one it has reached leaves it finished), when and what it checkpoints and saves, the logger, the
end-of-run suite, the process-group timeout, the memory check and the SLURM resources, and where the model is
cached. Everything else changes the numbers and must be the run's own: the algorithm, dataset, model (and its asset,
config.json's ``provenance.model``), rollout engine, sampling, optimizer, evaluation, seed, the other ``train`` keys,
the hardware profile (ZeRO stage, micro-batching, dtype, threads) and the world size (the processes that trained it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pods.errors import ConfigError
from pods.metrics import read_metrics
from pods.schema import Root

MAY_CHANGE = (
    "train.max_steps",
    "train.time_budget_s",
    "train.checkpoint_every_s",
    "train.checkpoint_every_steps",
    "train.checkpoint_at_end",
    "train.keep_checkpoints",
    "train.resume",
    "train.start_over",
    "train.save_final",
    "train.sampler_gap_warn",
    "logger",
    "eval.suite",
    "eval.suite_engine",
    "eval.suite_overrides",
    "hardware.dist_timeout_s",
    "hardware.gpu_memory_gb",
    "hardware.nproc_per_node",  # what a launcher should start; the world size that trained is compared instead
    "hardware.nnodes",  # as nproc_per_node
    "hardware.check_world_size",
    "hardware.slurm",
    "model.cache_dir",
)
ABSENT = "<absent>"
EXTEND = (
    "only the horizon (a larger train.max_steps or train.time_budget_s extends a run) and the checkpoint, logging and suite keys may change"
)


def world() -> int:
    """The processes of this run (the launcher's ``WORLD_SIZE``; one without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted key: leaf}; lists are leaves."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def record(run_dir: Path, resume: str) -> Path | None:
    """The run whose settings a resume must match: ``run_dir`` once it has a config.json, else (a checkpoint named
    by path) the run that wrote the checkpoint, when its config.json is there."""
    if (run_dir / "config.json").exists():
        return run_dir
    if resume != "auto" and (Path(resume).parent.parent / "config.json").exists():
        return Path(resume).parent.parent
    return None


def _settings(cfg: dict) -> dict[str, Any]:
    keep = {k: v for k, v in flat(cfg).items() if not any(k == m or k.startswith(m + ".") for m in MAY_CHANGE)}
    return {k: v for k, v in keep.items() if not k.startswith("provenance.") or k.startswith("provenance.model")}


def _default(cfg: Root, key: str) -> Any:
    """The schema's default of ``key`` (``section.name``): a run recorded before an option existed ran with it off, so a
    key absent from its record equals its default (ABSENT for nested keys)."""
    from pods.schema import defaults

    head, _, name = key.partition(".")
    section = getattr(cfg, head, None)
    return defaults(type(section)).get(name, ABSENT) if hasattr(section, "model_fields") and "." not in name else ABSENT


def differences(cfg: Root, prior: dict, world_now: int, world_then: int | None) -> list[str]:
    """The settings of ``prior`` (a run's config.json) that ``cfg`` changes, as ``key=then (now: value)``."""
    from pods.models import ASSET_KEYS

    m = cfg.model
    asset = ASSET_KEYS.get(m.builder)(m) if m.builder else {"asset": m.path}
    now = _settings(json.loads(json.dumps({**cfg.model_dump(), "provenance": {"model": asset}})))
    then = _settings(prior if "model" in prior.get("provenance", {}) else {**prior, "provenance": {"model": asset}})
    out = [
        f"{k}={json.dumps(then.get(k, ABSENT))} (now: {json.dumps(now.get(k, ABSENT))})"
        for k in sorted(set(now) | set(then))
        if then.get(k, ABSENT) != now.get(k, ABSENT) and not (k not in then and now.get(k) == _default(cfg, k))
    ]
    if world_then is not None and world_then != world_now:
        out.append(f"world size={world_then} processes (now: {world_now})")
    return out


def latest(ckpt_dir: Path) -> Path | None:
    from pods.checkpoint import latest as newest  # torch's module: only when a run is resumed

    return newest(ckpt_dir)


def ended(run_dir: Path, prior: dict) -> tuple[dict, dict] | None:
    """(last train row, the end-of-run evaluation after it) when the run in ``run_dir`` ended: that evaluation
    logged at its last step and the files its end writes in place (the final checkpoint, final/, checkpoints
    deleted); None for a run that stopped or was killed before its end."""
    path = run_dir / "metrics.jsonl"
    rows = read_metrics(path) if path.exists() else []
    last = max((i for i, r in enumerate(rows) if r.get("kind") == "train"), default=None)
    if last is None:
        return None
    step = rows[last]["step"]
    end = next((r for r in rows[last + 1 :] if r.get("kind") == "eval" and r.get("step") == step), None)
    t = prior.get("train", {})
    mode = {True: "full", False: "false", None: "false"}.get(t.get("checkpoint_at_end"), t.get("checkpoint_at_end"))
    ckpt = latest(run_dir / "checkpoints")
    if mode == "full" and (ckpt is None or ckpt.name != f"step_{step:06d}.pt"):
        return None
    if mode != "full" and (run_dir / "checkpoints").exists():
        return None
    if (t.get("save_final") or mode == "weights" or prior.get("eval", {}).get("suite")) and not (run_dir / "final").is_dir():
        return None
    return (rows[last], end) if end is not None else None


def reached(row: dict, cfg: Root) -> bool:
    """Whether a run at train row ``row`` has reached ``cfg``'s horizon (steps or training seconds, whichever first)."""
    t = cfg.train
    return bool((t.max_steps and row["step"] >= t.max_steps) or (t.time_budget_s and row["train_time"] >= t.time_budget_s))


_KEPT: dict[tuple[str, str], dict | None] = {}  # verdicts decided ahead of a run (its command's preflight), each taken once


def _key(cfg: Root, run_dir: str | Path) -> tuple[str, str]:
    return json.dumps(cfg.model_dump(), sort_keys=True, default=str), str(Path(run_dir).resolve())


def ahead(cfg: Root, run_dir: str | Path) -> dict | None:
    """``decide`` for a run about to start, before anything is written into ``run_dir`` (``pods.train``'s preflight):
    the verdict is kept for the run, so that its own ``check`` (``pods.loop.train``) takes it instead of deciding again."""
    _KEPT[_key(cfg, run_dir)] = end = decide(cfg, run_dir)
    return end


def kept(cfg: Root, run_dir: str | Path) -> dict | None:
    """The verdict decided ahead for this run (``ahead``), else decided now and kept: the run's own ``check`` takes it."""
    key = _key(cfg, run_dir)
    return _KEPT[key] if key in _KEPT else ahead(cfg, run_dir)


def forget() -> None:
    """Drop every verdict kept: a new command decides its runs afresh (``pods.train.main``)."""
    _KEPT.clear()


def check(cfg: Root, run_dir: str | Path, world_now: int | None = None) -> dict | None:
    """The verdict on a run about to start (``decide``): taken, once, when its command decided it ahead (``ahead``), so
    one run decides its resume once; otherwise decided now."""
    key = _key(cfg, run_dir)
    if world_now is None and key in _KEPT:
        return _KEPT.pop(key)
    return decide(cfg, run_dir, world_now)


def decide(cfg: Root, run_dir: str | Path, world_now: int | None = None) -> dict | None:
    """Before anything loads: ``ConfigError`` (one line) when ``cfg`` may not resume the run at ``run_dir``; the run's
    end-of-run evaluation row when it is finished (``auto``: nothing to do); None when the loop should run."""
    resume, run_dir = cfg.train.resume, Path(run_dir)
    if not resume:
        return fresh(cfg, run_dir)
    src = record(run_dir, resume)
    if src is None:
        return None
    try:
        prior = json.loads((src / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"train.resume: cannot read {src / 'config.json'} ({type(e).__name__}): not a run directory of pods") from None
    setup = (
        next((r for r in read_metrics(src / "metrics.jsonl") if r.get("kind") == "setup"), {}) if (src / "metrics.jsonl").exists() else {}
    )
    diffs = differences(cfg, prior, world() if world_now is None else world_now, setup.get("world_size"))
    if diffs:
        shown = ", ".join(diffs[:4]) + (f" and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        raise ConfigError(f"train.resume: {src} ran with other settings: {shown}; a resume continues a run exactly: {EXTEND}")
    done = ended(run_dir, prior) if resume == "auto" and src == run_dir else None
    if done is None:
        return unsaved(run_dir) if resume == "auto" and src == run_dir else None
    if reached(done[0], cfg):
        return done[1]
    if latest(run_dir / "checkpoints") is None:
        mode = prior.get("train", {}).get("checkpoint_at_end")
        raise ConfigError(
            f"train.resume: {run_dir} ended at step {done[0]['step']} and kept no checkpoint (train.checkpoint_at_end={mode}): "
            "it cannot be extended; start a new run directory"
        )
    return None


RECORD = ("config.json", "metrics.jsonl", "checkpoints")  # what a run writes into its directory (Hydra's files are not a run)


def trained_to(run_dir: Path) -> int:
    """The last step ``run_dir``'s metrics.jsonl logged a train row for (0: none, or no file)."""
    path = run_dir / "metrics.jsonl"
    return max((r.get("step", 0) for r in read_metrics(path, "train")), default=0) if path.exists() else 0


def fresh(cfg: Root, run_dir: Path) -> None:
    """A run started without ``train.resume`` into ``run_dir``: ``ConfigError`` (one line) when the directory already
    holds a run (its config.json, metrics.jsonl or checkpoints/); with ``train.start_over=true`` that run is moved
    aside instead (``aside``), never deleted. Nothing is written before either."""
    held = [name for name in RECORD if (run_dir / name).exists()]
    if not held:
        return None
    if not cfg.train.start_over:
        step = trained_to(run_dir)
        raise ConfigError(
            f"{run_dir} already holds a run ({', '.join(held)}{f'; trained to step {step}' if step else ''}): "
            "train.resume=auto continues it; another directory (hydra.run.dir, hydra.sweep.dir) starts a new one; "
            "train.start_over=true moves it aside and starts again here"
        )
    if os.environ.get("RANK", "0") == "0":  # one process moves it; the other ranks of a torchrun start into the empty place
        aside(run_dir)
    return None


def aside(run_dir: Path) -> Path:
    """Move the run in ``run_dir`` to ``<run_dir>.old<k>`` (the first free k), said in one warning."""
    from pods.log import get

    k = next(k for k in range(1, 10**6) if not run_dir.with_name(f"{run_dir.name}.old{k}").exists())
    to = run_dir.with_name(f"{run_dir.name}.old{k}")
    os.replace(run_dir, to)
    get(__name__).warning(f"train.start_over: moved the run in {run_dir} aside to {to}; this run starts in {run_dir}")
    return to


def unsaved(run_dir: Path) -> None:
    """``auto`` on a run that trained steps but holds no checkpoint: resuming would start at step 0 and drop those rows
    without a word, so ``ConfigError`` in one line (a run that logged only its start begins again as it did)."""
    step = trained_to(run_dir)
    if step and latest(run_dir / "checkpoints") is None:
        raise ConfigError(
            f"train.resume: {run_dir} trained to step {step} but holds no checkpoint to continue from (it would start at step 0 "
            "and drop the rows logged so far): train.start_over=true without train.resume moves it aside and starts again"
        )
    return None


def finished_line(run_dir: str | Path, end: dict) -> str:
    """What a resume of a finished run says (its only output)."""
    acc = end.get("accuracy")
    score = f", final eval accuracy {acc:.3f}" if isinstance(acc, float | int) else ""
    return (
        f"pods: {run_dir} is finished (step {end['step']}{score}): nothing to do; "
        "to extend it, resume with a larger train.max_steps or train.time_budget_s"
    )


def kept_work(run_dir: str | Path) -> str:
    """What a run stopped by a failure keeps: its last checkpoint and how to continue from it."""
    last = latest(Path(run_dir) / "checkpoints")
    if last is None:
        return f"no checkpoint was written yet: {run_dir} holds the rows logged so far"
    return f"{run_dir} keeps {last.name}: the same command with hydra.run.dir={run_dir} train.resume=auto continues from it"
