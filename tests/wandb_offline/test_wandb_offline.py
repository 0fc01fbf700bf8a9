"""W&B offline with the real wandb library (no model): one run id per training run across resumes, every step
once in the offline records, a kill -9 segment set aside and its rows replayed, a small completions table.

Segments are written by ``pods.metrics.MetricsLogger`` in child processes (a kill -9 needs one) with synthetic
rows; the history is read back from wandb's own records (``pods.wandb_log.records``: wandb's protobufs)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from pods.metrics import MetricsLogger, read_metrics
from pods.schema import check
from pods.wandb_log import ASIDE, COMPLETIONS, ID_FILE, TIME, identity, offline_history, records, segments
from support.wandb_runs import start, wandb_cfg, write_rows


@pytest.mark.slow  # three child processes: about 50 s at load 10 on 2 cores
def test_kill9_then_resume_gives_one_run_with_every_step_once(tmp_path):
    cfg = wandb_cfg()
    assert start(tmp_path, cfg, 0, 3) == 0  # pre-empted after step 3: checkpoint at 3, clean close
    assert start(tmp_path, cfg, 4, 7, resume=3, kill=True) == -signal.SIGKILL  # killed at step 7, last checkpoint 5
    assert start(tmp_path, cfg, 6, 10, resume=5) == 0  # resumed from step 5's checkpoint
    rid = logger_id(tmp_path)
    segs = segments(tmp_path)
    assert len(segs) == 2 and {s.run_id for s in segs} == {rid}  # the killed segment holds nothing wandb sync can read
    killed = list((tmp_path / ASIDE).iterdir())
    assert len(killed) == 1 and killed[0].name.endswith(rid)
    history = offline_history(tmp_path, rid)
    assert [r["_step"] for r in history] == list(range(11))  # every step once, in order: what `wandb sync` sends
    evals = [r for r in history if "eval/accuracy" in r]
    assert [r["_step"] for r in evals] == [0, 2, 4, 6, 8, 10] and all(r[TIME] == 1.5 * r["_step"] for r in evals)
    jsonl = {r["step"]: r for r in read_metrics(tmp_path / "metrics.jsonl", "train")}
    assert sorted(jsonl) == list(range(1, 11))  # rows after the checkpoint were dropped before the resume re-ran them
    assert all(r["train/loss"] == jsonl[r["_step"]]["loss"] for r in history if r["_step"])
    assert segs[1].rows[0]["_step"] == segs[0].last_step + 1  # the resumed segment starts where the first ended


def test_every_start_has_the_runs_id_and_a_fresh_start_gets_a_new_one(tmp_path):
    cfg = check(wandb_cfg())
    ids = []
    for resume in (None, 2, None):  # first start; a resume from step 2; a fresh start in the same directory
        logger = MetricsLogger(tmp_path, cfg, resume_step=resume)
        ids.append(logger.wandb.run.id)
        logger.log({"kind": "train", "step": 3, "train_time": 1.0, "loss": 0.5})
        logger.close()
    assert ids[0] == ids[1] != ids[2]
    assert (tmp_path / "wandb" / ID_FILE).read_text().strip() == ids[2]
    assert sorted(s.run_id for s in segments(tmp_path)) == sorted(ids)


def test_completions_table_is_small_and_names_its_step(tmp_path):
    cfg = wandb_cfg()
    write_rows(str(tmp_path), cfg, 0, 2, None, False)
    rows = [r for r in offline_history(tmp_path) if "completions" in r]
    assert [r["_step"] for r in rows] == [0, 2]  # one table per evaluation, with the eval row
    seg = segments(tmp_path)[0].path
    for r in rows:
        assert r["completions"]["_type"] == "table-file" and r["completions"]["nrows"] == COMPLETIONS < 20
        table = json.loads((seg / "files" / r["completions"]["path"]).read_text())
        assert table["columns"][:3] == ["step", "train_time", "prompt"] and len(table["data"]) == COMPLETIONS
        assert {row[0] for row in table["data"]} == {r["_step"]} and len({row[2] for row in table["data"]}) == COMPLETIONS


def test_reader_stops_at_a_torn_tail(tmp_path):
    write_rows(str(tmp_path), wandb_cfg(), 0, 4, None, False)
    full = next(segments(tmp_path)[0].path.glob("*.wandb"))
    torn = tmp_path / "torn.wandb"
    torn.write_bytes(full.read_bytes()[: full.stat().st_size - 5])  # the last record loses its end
    kinds = [r.WhichOneof("record_type") for r in records(full)]
    assert [r.WhichOneof("record_type") for r in records(torn)] == kinds[:-1] and kinds[-1] in ("exit", "final", "footer")


def test_identity_outside_hydra_names_the_run_from_its_config(monkeypatch):
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # another test's compose may have left a job's config set
    cfg = wandb_cfg()
    cfg["seed"] = 7
    ident = identity(check(cfg))
    assert ident["group"] is None and ident["job_type"] == "grpo_pods"  # no experiment, no sweep: no group
    assert ident["name"] == "grpo_pods n=4 m=2 max_variance seed=7"
    assert ident["tags"][0] == "mine" and {"grpo_pods", "max_variance", "tiny", "toy_arith", "hf", "cpu"} <= set(ident["tags"])
    cfg["logger"].update(group="fig", run_name="mine-7")
    assert identity(check(cfg))["group"] == "fig" and identity(check(cfg))["name"] == "mine-7"


@pytest.mark.slow  # a child process: about 15 s at load 10 on 2 cores
def test_a_start_killed_before_its_first_checkpoint_does_not_block_wandb_sync(tmp_path):
    cfg = wandb_cfg()
    assert start(tmp_path, cfg, 0, 1, kill=True) == -signal.SIGKILL  # nothing flushed: not even the run record
    (killed,) = (tmp_path / "wandb").glob("offline-run-*")
    assert segments(tmp_path)[0].run_id is None  # `wandb sync <run_dir>/wandb` stops at such a file
    logger = MetricsLogger(tmp_path, check(cfg), resume_step=0)  # resume=auto found no checkpoint: a fresh start
    logger.close()
    assert [p.name for p in (tmp_path / ASIDE).iterdir()] == [killed.name]
    assert [s.run_id for s in segments(tmp_path)] == [logger_id(tmp_path)] != [killed.name.split("-")[-1]]


def logger_id(run_dir: Path) -> str:
    return (run_dir / "wandb" / ID_FILE).read_text().strip()
