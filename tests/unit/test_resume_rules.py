"""The parts of an exact resume, without a model: a checkpoint refuses another ZeRO stage before any state is read
into the backend (issue 35, case 7: DeepSpeed's AssertionError deep inside load_checkpoint), and metrics.jsonl
survives a kill mid-write (a cut last row dropped with a warning; the rows kept on resume byte for byte)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from pods import checkpoint
from pods.errors import ConfigError
from pods.metrics import MetricsLogger, read_metrics
from pods.schema import check
from support.config import compose


class Sampler:
    def state_dict(self) -> dict:
        return {"position": 3}

    def load_state_dict(self, sd: dict) -> None:
        self.loaded = sd


class Sharded:
    """A backend with ZeRO's sharded state (``stage``), as ``DeepSpeedBackend`` has."""

    sharded = True

    def __init__(self, stage: int):
        self.stage, self.loaded = stage, False

    def save_sharded(self, directory: Path) -> None:
        directory.mkdir(parents=True)

    def load_sharded(self, directory: Path) -> None:
        self.loaded = True
        raise AssertionError("DeepSpeed's load_checkpoint, deep inside")


class Local:
    sharded = False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        raise AssertionError("never reached")


@pytest.mark.parametrize("saved,loaded,named", [(2, 3, "ZeRO stage 2; this run trains under ZeRO stage 3"), (None, 3, "no ZeRO")])
def test_a_checkpoint_resumes_only_under_its_own_zero_stage(tmp_path, saved, loaded, named):
    path = tmp_path / "checkpoints" / "step_000002.pt"
    checkpoint.save(path, {"step": 2}, Local() if saved is None else Sharded(saved), Sampler(), {"select": None})
    backend = Sharded(loaded)
    with pytest.raises(ConfigError) as e:
        checkpoint.load(path, backend, Sampler())
    assert str(e.value).startswith(f"train.resume: checkpoint {path} was written under ") and named in str(e.value)
    assert "\n" not in str(e.value) and "hardware.deepspeed.stage" in str(e.value) and not backend.loaded


def test_the_same_stage_goes_on_to_load(tmp_path):
    path = tmp_path / "step_000001.pt"
    checkpoint.save(path, {"step": 1}, Sharded(2), Sampler(), {"select": None})
    backend = Sharded(2)
    with pytest.raises(AssertionError, match="deep inside"):
        checkpoint.load(path, backend, Sampler())
    assert backend.loaded


ROWS = [{"kind": "setup", "step": 0}, {"kind": "train", "step": 1, "loss": 0.5}, {"kind": "train", "step": 2, "loss": 0.25}]


def write(path: Path, rows: list[dict], tail: str = "") -> str:
    text = "".join(json.dumps(r) + "\n" for r in rows) + tail
    path.write_text(text)
    return text


def test_a_last_row_cut_short_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    write(path, ROWS, '{"kind": "train", "step": 3, "lo')
    logging.getLogger("pods").propagate = True  # (another test's pods.log.setup may have given it a handler of its own)
    with caplog.at_level(logging.WARNING, logger="pods.metrics"):
        assert read_metrics(path) == ROWS and read_metrics(path, "train") == ROWS[1:]
    assert "cut short mid-write" in caplog.text


def test_a_broken_row_inside_the_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "setup", "step": 0}\n{"kind": "tr\n{"kind": "train", "step": 1}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl: line 2 is not a JSON row"):
        read_metrics(path)


def test_resume_keeps_the_rows_up_to_its_checkpoint_byte_for_byte_and_appends_whole_rows(tmp_path):
    cfg = check(compose([]))
    path = tmp_path / "metrics.jsonl"
    text = write(path, ROWS)
    MetricsLogger(tmp_path, cfg, resume_step=2)
    assert path.read_text() == text  # nothing after the checkpoint: the file is left as it is
    write(path, ROWS, '{"kind": "train", "st')
    logger = MetricsLogger(tmp_path, cfg, resume_step=1)
    assert path.read_text() == text.split("\n", 2)[0] + "\n" + text.split("\n", 2)[1] + "\n"  # step 2 and the cut row gone
    logger.log({"kind": "train", "step": 2, "loss": float("nan")})
    assert read_metrics(path)[-1] == {"kind": "train", "step": 2, "loss": None} and path.read_text().endswith("}\n")
    MetricsLogger(tmp_path, cfg, resume_step=0)  # a resume that found no checkpoint starts the run again
    assert path.read_text() == ""
