"""W&B for a pods run: one W&B run per training run, the paper's axes, sweeps grouped, completions to look at.

- **One run per training run.** The W&B run id is made at the first start and kept in ``<run_dir>/wandb/pods-run-id``;
  every resume from a checkpoint (``train.resume``, a SLURM requeue) reuses it, a fresh start makes a new one.
  W&B only ever receives a step once: rows of steps an earlier segment already holds are not sent again, and rows
  an earlier segment lost (a kill -9 loses what wandb had not flushed) are replayed from ``metrics.jsonl``.
  Offline, each start writes one ``offline-run-*`` directory; ``wandb sync <run_dir>/wandb`` uploads them in start
  order into the one run, each continuing where the previous ended. A segment that did not finish (no exit
  record: killed) is moved to ``<run_dir>/wandb-incomplete/`` when the run resumes, and its rows are replayed: a
  killed start often holds nothing but wandb's 7-byte file header, and ``wandb sync`` of a directory with such a
  file uploads nothing (a fresh start moves those aside too).
- **Axes.** ``eval/*`` against ``train_time`` (training seconds: the paper's x-axis), ``train/*`` against the
  step; ``best/*`` and ``final/*`` summaries for the accuracies.
- **Grouping.** group = ``logger.group``, else the experiment's name (``experiment=...``), else, in a multirun,
  its sweep directory: every job of a multirun or SLURM array lands in one group. job_type = the algorithm; the
  name says algorithm, n, m, rule and seed; tags come from the config; the resolved config is the run's config.
- **Completions.** A few sampled completions per evaluation (prompt, completion, gold, reward, correct) as a
  table; the memory estimate (``pods.memory``) and, on a GPU, the measured peak in the summary.

``offline_history(run_dir)`` (``pods.wandb_records``) reads back what ``wandb sync`` would send, from wandb's own
records.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from pods.wandb_records import offline_history, read_segment, records, segments  # noqa: F401 - the readers, re-exported

log = logging.getLogger("pods.wandb")

ID_FILE = "pods-run-id"  # under <run_dir>/wandb/
ASIDE = "wandb-incomplete"  # next to <run_dir>/wandb/: segments that did not finish, out of `wandb sync`'s way
TIME = "train_time"  # the eval metrics' x-axis
TABLE = "completions"  # the history key of the completions table
TRACKED = ("accuracy", "both_accuracy", "format_accuracy", "reward")  # best/* and final/* summaries
COMPLETIONS = 8  # table rows per evaluation unless logger.completions says otherwise
COLUMNS = ["step", "train_time", "prompt", "completion", "gold", "reward", "correct", "formatted"]


def set_aside_unfinished(run_dir: Path, run_id: str | None) -> list[Path]:
    """Move to ``<run_dir>/wandb-incomplete/`` the segments ``wandb sync`` cannot take: those with no run record
    at all (a start killed before wandb flushed anything; ``wandb sync`` of the directory stops at one) and, when
    resuming ``run_id``, that run's segments that never finished (killed: no exit record), whose rows are replayed."""
    own = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?") if run_id else None  # -N: same second
    moved = []
    for path in Path(run_dir, "wandb").glob("offline-run-*"):
        if not path.is_dir() or path.is_symlink():
            continue
        seg = read_segment(path)
        if seg.run_id is None or (own and own.fullmatch(path.name) and not seg.finished):
            dest = Path(run_dir, ASIDE, path.name)
            dest.parent.mkdir(exist_ok=True)
            shutil.move(str(path), str(dest))
            moved.append(dest)
    return moved


# --- who the run is: id, group, job type, name, tags ---


def run_id(run_dir: Path, lg, resumed: bool) -> str:
    """``logger.run_id`` if set; else the id stored in the run directory when resuming; else a new one (stored)."""
    from wandb.sdk.lib.runid import generate_id

    path = run_dir / "wandb" / ID_FILE
    stored = path.read_text().strip() if resumed and path.exists() else None
    rid = lg.run_id or stored or generate_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rid + "\n")
    return rid


def hydra_runtime() -> tuple[dict, str | None]:
    """The Hydra job's group choices and, in a multirun, its sweep directory; empty outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized():
            return {}, None
        hc = HydraConfig.get()
        return dict(hc.runtime.choices), (hc.sweep.dir if hc.mode == RunMode.MULTIRUN else None)
    except (ImportError, ValueError):
        return {}, None


def identity(cfg) -> dict:
    """wandb.init's group, job_type, name and tags for this config."""
    lg, a = cfg.logger, cfg.algorithm
    choices, sweep_dir = hydra_runtime()
    experiment = choices.get("experiment")
    group = lg.group or experiment or ("/".join(Path(sweep_dir).parts[-2:]) if sweep_dir else None)
    name = lg.run_name or f"{a.name} n={a.n} m={a.m} {a.rule} seed={cfg.seed}"
    derived = [a.name, a.rule, cfg.model.name, cfg.dataset.name, cfg.rollout.name, cfg.hardware.name, experiment, choices.get("sweep")]
    tags = list(dict.fromkeys(t[:64] for t in [*lg.tags, *derived] if t))  # W&B's tag limit: 64 characters
    return {"group": group, "job_type": a.name, "name": name, "tags": tags}


# --- rows ---


def flat(row: dict) -> dict:
    """A metrics row as W&B keys: ``<kind>/<key>`` for numbers, ``train_time`` shared by all kinds."""
    kind = row.get("kind", "train")
    out = {}
    for k, v in row.items():
        if k in ("kind", "step") or isinstance(v, str) or v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        if isinstance(v, (int, float)):
            out[k if k == TIME else f"{kind}/{k}"] = v
    return out


def pick(n_total: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``n_total`` (consecutive completions share a prompt)."""
    return sorted({int(i * n_total / k) for i in range(k)}) if n_total > k else list(range(n_total))


def memory_summary(cfg) -> dict:
    """The memory estimate's totals (GB per GPU); empty when it cannot be made for this config."""
    try:
        from pods.memory.estimator import estimate

        est = estimate(cfg)
    except Exception as e:  # noqa: BLE001 - an estimate is a nicety: a config it does not cover logs nothing
        log.debug(f"no memory estimate for W&B: {e}")
        return {}
    out = {f"memory/{k}_gb": round(getattr(est, f"{k}_gb"), 3) for k in ("total", "update", "resident", "rollout")}
    return {**out, "memory/micro_batch": est.micro_batch, **({"memory/card_gb": est.card_gb} if est.card_gb else {})}


def measured_peak() -> dict:
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {
        "memory/peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9,
        "memory/peak_reserved_gb": torch.cuda.max_memory_reserved() / 1e9,
    }


# --- the run ---


class WandbRun:
    """The W&B side of ``pods.metrics.MetricsLogger``: ``log(row)`` for every metrics row, ``keep_completions``
    for the evaluation's samples (shown with the next eval row), ``close()`` at the end.

    ``history``: the run's ``metrics.jsonl`` rows so far (after a resume: up to the checkpoint), replayed where
    W&B does not hold them yet."""

    def __init__(self, run_dir: str | Path, cfg, resume_step: int | None, history: list[dict]):
        import wandb

        run_dir, lg = Path(run_dir), cfg.logger
        resumed = bool(resume_step)  # from a checkpoint; step 0 holds nothing a fresh start would not
        rid = run_id(run_dir, lg, resumed)
        sent = -1  # W&B already holds every step <= sent (earlier segments)
        if lg.mode == "offline":
            for path in set_aside_unfinished(run_dir, rid if resumed else None):
                log.warning(f"W&B: {path.name} never finished (a killed start): moved to {path.parent}, out of wandb sync's way")
            sent = max((s.last_step for s in segments(run_dir, rid)), default=-1) if resumed else -1
        self.run = wandb.init(
            project=lg.project,
            entity=lg.entity,
            mode=lg.mode,
            dir=str(run_dir),
            id=rid,
            resume="allow",
            reinit="finish_previous",
            config=cfg.model_dump(),
            **identity(cfg),
        )
        if lg.mode == "online" and self.run.resumed:
            sent = self.run.starting_step - 1  # what the server holds
        self.sent, self.pending, self.best = sent, None, {}
        self.limit = getattr(lg, "completions", COMPLETIONS)
        self._define_metrics()
        self.run.summary.update(memory_summary(cfg))
        for row in history:
            self.log(row)

    def _define_metrics(self) -> None:
        self.run.define_metric(TIME, summary="max")
        self.run.define_metric("train/*")  # against the step, W&B's default x-axis
        self.run.define_metric("eval/*", step_metric=TIME)

    def log(self, row: dict) -> None:
        kind, step = row.get("kind", "train"), row.get("step")
        if kind == "setup":  # numbers about the run, not a curve: setup/<key> in the summary
            self.run.summary.update({k: v for k, v in flat(row).items() if k != TIME})
            return
        if kind == "eval":
            self._summaries(row)
        if step is None or step <= self.sent:  # an earlier segment holds this step: W&B gets every step once
            self.pending = None
            return
        data = flat(row)
        if kind == "eval" and self.pending:
            data[TABLE] = self._table(row)
        self.run.log(data, step=step)

    def _summaries(self, row: dict) -> None:
        """``best/<metric>`` (with its step and training seconds) and ``final/<metric>`` over every eval row."""
        out = {f"final/{m}": row[m] for m in TRACKED if m in row}
        out.update({"final/step": row.get("step"), f"final/{TIME}": row.get(TIME)})
        for m in TRACKED:
            if m in row and row[m] is not None and (m not in self.best or row[m] > self.best[m]):
                self.best[m] = row[m]
                out.update({f"best/{m}": row[m], f"best/{m}_step": row.get("step"), f"best/{m}_{TIME}": row.get(TIME)})
        self.run.summary.update({k: v for k, v in out.items() if v is not None})

    def keep_completions(self, rows: list[dict]) -> None:
        """Completions (``prompt``, ``completion``, ``gold``, ``reward``, ``correct``, ``formatted``) for the next
        eval row's table; at most ``logger.completions`` are kept."""
        self.pending = [rows[i] for i in pick(len(rows), self.limit)] if self.limit else None

    def _table(self, row: dict):
        import wandb

        data = [[row.get("step"), row.get(TIME), *(r.get(c) for c in COLUMNS[2:])] for r in self.pending]
        self.pending = None
        return wandb.Table(columns=COLUMNS, data=data)

    def close(self) -> None:
        import wandb

        self.run.summary.update(measured_peak())
        self.run.finish()
        wandb.teardown()  # waits until wandb has written the whole segment (finish alone can return before)


def completion_rows(tok, ro, golds: list[str], scores, keep: list[int]) -> list[dict]:
    """Table rows for completions ``keep`` of an evaluation's ``Rollouts`` (prompt i's completions are rows
    i*n .. i*n+n-1), with their gold answers and ``pods.tasks`` scores."""
    return [
        {
            "prompt": tok.decode(ro.prompt_ids[j // ro.n], skip_special_tokens=True),
            "completion": ro.texts[j],
            "gold": golds[j],
            "reward": scores[j].reward,
            "correct": scores[j].correct,
            "formatted": scores[j].formatted,
        }
        for j in keep
    ]


def completion_sink(run: WandbRun, tok) -> Callable:
    """``evaluate``'s ``on_samples(ro, golds, scores)``: decodes only the completions the table keeps."""

    def on_samples(ro, golds: list[str], scores) -> None:
        run.keep_completions(completion_rows(tok, ro, golds, scores, pick(len(ro.texts), run.limit)))

    return on_samples
