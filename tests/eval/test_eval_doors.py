"""``pods-eval``'s doors through the command line (issue 35, cases 9 and 13): a corrupt checkpoint, a directory with no
model, an ``--out`` that is a file or cannot be written, an offline hub benchmark: one line naming what pods-eval takes,
exit code 2, nothing left behind. ``--checkpoint latest`` naming a file that is gone falls back to the newest one.
In-process through ``pods.eval.cli.main(argv)`` (``support.doors``), but the offline hub case: a real process, as the
hub's cache folders are read when huggingface_hub and datasets are first imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from support.config import ROOT
from support.doors import door

TOY = ["--suite", "toy", "suite.only=[toy_arith]", "suite.benchmarks.toy_arith.size=2", "suite.samples=1", "suite.max_tokens=8"]


def pods_eval(args, cwd=ROOT, process: bool = False, **env):
    if not process:
        return door("pods.eval", args, cwd=cwd, env=env)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "pods.eval", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def one_line(p) -> str:
    """The refusal: exit code 2, one line on stderr, no traceback."""
    err = p.stderr.strip()
    assert p.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, p.stderr[-3000:]
    assert err.startswith("pods-eval: ")
    return err


@pytest.fixture
def run_dir(tiny_dir, tmp_path):
    """A run directory with config.json and checkpoints/ (no final/)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = {"model": {"name": "tiny", "path": str(tiny_dir)}, "algorithm": {"name": "grpo"}, "hardware": {}}
    (run / "config.json").write_text(json.dumps(cfg))
    return run


def save_checkpoint(tiny_dir, file):
    from transformers import AutoModelForCausalLM

    from pods.checkpoint import FORMAT

    torch.save({"format": FORMAT, "backend": {"model": AutoModelForCausalLM.from_pretrained(str(tiny_dir)).state_dict()}}, file)


def test_a_truncated_or_foreign_checkpoint_is_one_line_naming_pods_eval_options(tiny_dir, run_dir):
    ckpts = run_dir / "checkpoints"
    save_checkpoint(tiny_dir, ckpts / "step_000001.pt")
    blob = (ckpts / "step_000001.pt").read_bytes()
    (ckpts / "step_000002.pt").write_bytes(blob[: len(blob) // 2])  # a kill while it was written
    (ckpts / "step_000003.pt").write_text("not a checkpoint\n")
    for name, says in (("step_000002.pt", "cannot be read, truncated or corrupt"), ("step_000003.pt", "is not a pods checkpoint")):
        err = one_line(pods_eval([run_dir, "--checkpoint", name, *TOY]))
        assert says in err and "--checkpoint FILE" in err and "step_000001.pt" in err, err
        assert "train.resume" not in err and "file an issue" not in err and err.endswith(")"), err  # whole, not cut mid-sentence
    assert not (run_dir / "eval").exists()


def test_latest_naming_a_missing_file_falls_back_to_the_newest_checkpoint(tiny_dir, run_dir):
    ckpts = run_dir / "checkpoints"
    save_checkpoint(tiny_dir, ckpts / "step_000001.pt")
    (ckpts / "latest").write_text("step_000009.pt\n")  # the marker names a checkpoint that was removed
    p = pods_eval([run_dir, "--checkpoint", "latest", *TOY])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "latest names step_000009.pt, which does not exist; using the newest checkpoint, step_000001.pt" in p.stderr
    assert json.loads((run_dir / "eval" / "toy" / "config.json").read_text())["weights"] == str(ckpts / "step_000001.pt")


def test_a_directory_with_no_model_is_refused_and_leaves_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    err = one_line(pods_eval([empty, "--suite", "toy"], cwd=tmp_path))
    assert "holds no model" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no ./eval/toy/ left behind


def test_weights_without_a_tokenizer_point_at_the_run(tiny_dir, run_dir):
    final = run_dir / "final"  # a final/ as runs wrote it before it held its tokenizer
    final.mkdir()
    for name in ("config.json", "model.safetensors"):
        (final / name).write_bytes((tiny_dir / name).read_bytes())
    err = one_line(pods_eval([final, *TOY]))
    assert "has model weights but no tokenizer" in err and f"pods-eval {run_dir}" in err


@pytest.mark.parametrize("out", ["a_file", "a_file/below", "/proc/pods-eval-out"])
def test_an_out_that_is_a_file_or_unwritable_is_one_line(tiny_dir, tmp_path, out):
    (tmp_path / "a_file").write_text("mine\n")
    err = one_line(pods_eval([tiny_dir, *TOY, "--out", out], cwd=tmp_path))
    assert err.startswith("pods-eval: --out: ")
    assert (tmp_path / "a_file").read_text() == "mine\n"


def test_an_offline_hub_benchmark_names_the_suite_key_for_local_files(tiny_dir, tmp_path):
    cache = {"HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}  # surely not cached
    err = one_line(
        pods_eval([tiny_dir, "--suite", "pods", "suite.only=[math500]", "--out", tmp_path], process=True, HF_HUB_OFFLINE="1", **cache)
    )
    assert "suite.benchmarks.math500.files=" in err and "dataset.train_files" not in err
    assert not (tmp_path / "eval").exists()


def test_a_corrupt_checkpoint_with_no_other_one_says_so(run_dir):
    """It used to say "(in .../checkpoints: none)" where it meant that no other checkpoint is there."""
    (run_dir / "checkpoints" / "step_000001.pt").write_text("not a checkpoint\n")
    err = one_line(pods_eval([run_dir, "--checkpoint", "step_000001.pt", *TOY]))
    assert err.endswith(f"; {run_dir / 'checkpoints'} holds no other checkpoint") and ": none" not in err, err


def test_help_says_what_a_run_directory_is_evaluated_at_by_default():
    """``(default: final/)`` was wrong for most runs: they have no final/ unless train.save_final=true."""
    p = pods_eval(["--help"])
    text = " ".join(p.stdout.split())
    assert p.returncode == 0 and "(default: final/)" not in text
    assert (
        "default: its final/ when the run saved one (train.save_final=true or train.checkpoint_at_end=weights), else its newest checkpoint"
        in text
    )


def test_an_out_where_no_file_can_be_made_says_the_errno_as_its_reason(run_dir):
    """/proc exists but takes no file: the message used to say "/proc is not writable (No such file or directory)"."""
    err = one_line(pods_eval([run_dir, *TOY, "--out", "/proc/pods-out"]))
    assert err == "pods-eval: --out: cannot write /proc/pods-out: making a file in /proc failed (No such file or directory)", err
