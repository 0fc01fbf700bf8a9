"""The training run's seed and data doors through ``python -m pods.train`` (issue 35, case 8): a seed out of range, an
empty dataset file, a file with the wrong columns: one line and exit code 2, before any model loads."""

from __future__ import annotations

import json

import pytest

from support.doors import door

GOOD = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}


def train(args):
    """``python -m pods.train ARGS``, in-process (``support.doors``)."""
    return door("pods.train", args)


def one_line(p) -> str:
    """The refusal: exit code 2, no traceback, the message as stderr's last line (above it at most the progress bars of
    ``datasets`` reading the file)."""
    err = p.stderr.strip()
    assert p.returncode == 2 and "Traceback" not in err, p.stderr[-3000:]
    assert all(line.startswith("Generating ") for line in err.splitlines()[:-1] if line.strip()), p.stderr[-3000:]
    return err.splitlines()[-1]


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_out_of_range_is_refused_before_the_run_directory(tmp_path, seed):
    err = one_line(train([f"seed={seed}", f"hydra.run.dir={tmp_path / 'run'}"]))
    assert err.startswith("pods: config error: seed must be")
    assert not (tmp_path / "run").exists()  # before config.json is written


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "train_rows,test_rows,message",
    [
        ([], [GOOD], "dataset.train_files: {train} is empty (no records)"),
        ([GOOD], [], "dataset.test_files: {test} is empty (no records)"),
        (
            [{"q": "1 + 1", "a": "2"}],
            [GOOD],
            "dataset 'gsm8k' train record 0: none of the fields ['question'] in record with keys ['a', 'q']",
        ),
        ([GOOD], [{"question": "1 + 1"}], "dataset 'gsm8k' test record 0: none of the fields ['answer'] in record with keys ['question']"),
        ([{"question": "1 + 1", "answer": "2"}], [GOOD], "dataset 'gsm8k' train record 0: no '####' final answer in its 'answer' field"),
    ],
)
def test_an_empty_or_wrong_dataset_file_is_one_line_before_the_model_loads(tmp_path, train_rows, test_rows, message):
    train_file, test_file = jsonl(tmp_path / "train.jsonl", train_rows), jsonl(tmp_path / "test.jsonl", test_rows)
    no_model = tmp_path / "no_model"  # a model directory with nothing in it: loading it would fail with a traceback
    no_model.mkdir()
    data = ["dataset=gsm8k", f"dataset.train_files={train_file}", f"dataset.test_files={test_file}"]
    p = train([*data, f"model.path={no_model}", "model.builder=null", f"hydra.run.dir={tmp_path / 'run'}"])
    err = one_line(p)
    assert err == "pods: config error: " + message.format(train=train_file, test=test_file)
