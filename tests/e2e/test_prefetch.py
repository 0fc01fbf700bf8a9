"""scripts/prefetch.py: what the experiments and suites need from the hub, the overrides that point runs at local
copies (composed by Hydra here, and read by the real dataset loader), and the offline report of what is missing.

The downloads themselves need the hub (not reachable from this machine's tests); everything around them runs for real:
the planning composes the committed config tree, the copies are written by the same ``export_split`` the download
uses, and the script runs as its command with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import yaml

from support.config import ROOT
from support.doors import Ran, door

sys.path.insert(0, str(ROOT / "scripts"))
import prefetch  # noqa: E402
from prefetch import Model, Split  # noqa: E402

from pods.compose import CONF, compose_plain  # noqa: E402

GSM8K_EXP, MATH_EXP = "gsm8k_qwen3b_pods_64_16_l40s", "math_qwen3b_pods_32_8_l40s"
MATH_SUBSETS = ["algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory", "prealgebra", "precalculus"]
GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 12 pens; 5 are taken. How many remain?", "answer": "12 - 5 = 7\n#### 7"},
]


def test_a_paper_experiment_needs_its_model_and_both_splits():
    needs = prefetch.plan_experiment(GSM8K_EXP)
    assert needs.keys == {
        "model.path": [Model("Qwen/Qwen2.5-3B-Instruct")],
        "dataset.train_files": [Split("openai/gsm8k", "main", "train")],
        "dataset.test_files": [Split("openai/gsm8k", "main", "test")],
    }
    math = prefetch.plan_experiment(MATH_EXP).keys
    assert math["dataset.train_files"] == [Split("EleutherAI/hendrycks_math", s, "train") for s in MATH_SUBSETS]
    assert math["dataset.test_files"] == [Split("HuggingFaceH4/MATH-500", None, "test")]
    assert prefetch.plan_experiment("toy_pods_64_16_cpu").keys == {}  # the tiny model is built in code, the toy task too


def test_everything_covers_every_hub_model_and_dataset_the_config_tree_names():
    a = prefetch.parse(["--dir", "x"])
    items = {i for n in prefetch.plan(*prefetch.selection(a)) for i in n.items()}
    models = {yaml.safe_load(p.read_text()).get("path") for p in (CONF / "model").glob("[!_]*.yaml")}
    hub_models = {Model(m) for m in models if prefetch.is_hub_id(m)}
    assert hub_models and hub_models <= items  # every model group option with a hub id (the experiments use them all)
    used = {compose_plain([f"experiment={e}"])["dataset"]["name"] for e in prefetch.names("experiment")}
    for name in used:
        ds = yaml.safe_load((CONF / "dataset" / f"{name}.yaml").read_text())
        assert set(prefetch.hub_splits(ds.get("train_hub")) + prefetch.hub_splits(ds.get("test_hub"))) <= items, name


def test_the_overrides_compose_to_the_copies(tmp_path):
    for exp in (GSM8K_EXP, MATH_EXP):
        needs = prefetch.plan_experiment(exp)
        cfg = compose_plain([f"experiment={exp}", *needs.overrides(tmp_path)])
        assert cfg["model"]["path"] == str(tmp_path / "models" / "Qwen--Qwen2.5-3B-Instruct")
        train = [str(s.path(tmp_path)) for s in needs.keys["dataset.train_files"]]
        assert cfg["dataset"]["train_files"] == (train[0] if len(train) == 1 else train)
    spaced = tmp_path / "a dir"
    cfg = compose_plain([f"experiment={GSM8K_EXP}", *prefetch.plan_experiment(GSM8K_EXP).overrides(spaced)])
    assert cfg["dataset"]["test_files"] == str(spaced / "datasets" / "openai--gsm8k" / "main" / "test.jsonl")  # quoted for Hydra


def test_the_suite_overrides_compose_to_the_copies(tmp_path):
    from pods.eval.benchmarks import compose_suite

    needs = prefetch.plan_suite("pods")
    suite = compose_suite("pods", needs.overrides(tmp_path))
    assert suite.benchmarks["gsm8k"].files == str(Split("openai/gsm8k", "main", "test").path(tmp_path))
    assert suite.benchmarks["math500"].files == str(Split("HuggingFaceH4/MATH-500", None, "test").path(tmp_path))


def run_script(*args: str, process: bool = False) -> subprocess.CompletedProcess | Ran:
    """``scripts/prefetch.py ARGS`` offline: in-process as ``__main__`` (``support.doors``), or a real process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if not process:
        return door(ROOT / "scripts" / "prefetch.py", list(args), env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prefetch.py"), *args], capture_output=True, text=True, env=env, timeout=300
    )


def fake_model(root, shards: int) -> None:
    """A model copy's files as from_pretrained reads them: config, a shard index, and ``shards`` of its 2 shards."""
    d = Model("Qwen/Qwen2.5-3B-Instruct").path(root)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
    names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": names[0], "b": names[1]}}))
    for name in names[:shards]:
        (d / name).write_bytes(b"")


def test_offline_the_report_names_what_is_missing_until_it_is_there(tmp_path):
    import datasets

    p = run_script("--dir", str(tmp_path), "--experiments", GSM8K_EXP, process=True)
    assert p.returncode == 1 and "3 of 3 missing (offline" in p.stderr
    assert sum(line.startswith("MISSING") for line in p.stdout.splitlines()) == 3
    fake_model(tmp_path, shards=1)  # one shard of two: still missing
    for split in ("train", "test"):
        prefetch.export_split(datasets.Dataset.from_list(GSM8K_ROWS), Split("openai/gsm8k", "main", split).path(tmp_path))
    p = run_script("--dir", str(tmp_path), "--experiments", GSM8K_EXP, "--check")
    missing = [line for line in p.stdout.splitlines() if line.startswith("MISSING")]
    assert p.returncode == 1 and len(missing) == 1 and "model Qwen/Qwen2.5-3B-Instruct" in missing[0]
    fake_model(tmp_path, shards=2)
    p = run_script("--dir", str(tmp_path), "--experiments", GSM8K_EXP)
    assert p.returncode == 0, p.stderr
    written = yaml.safe_load((tmp_path / "overrides.yaml").read_text())
    assert written == {GSM8K_EXP: prefetch.plan_experiment(GSM8K_EXP).overrides(tmp_path)}


def test_a_run_on_the_copies_reads_them_offline(tmp_path, monkeypatch):
    import datasets

    from pods.schema import HubDataset
    from pods.tasks.hub import load_split

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for split in ("train", "test"):
        prefetch.export_split(datasets.Dataset.from_list(GSM8K_ROWS), Split("openai/gsm8k", "main", split).path(tmp_path))
    line = run_script("--dir", str(tmp_path), "--args", GSM8K_EXP).stdout.strip()
    cfg = compose_plain([f"experiment={GSM8K_EXP}", *shlex.split(line)])
    records, where = load_split(HubDataset.of(cfg["dataset"]), "train")  # the section a run reads
    assert records == GSM8K_ROWS and where.startswith("files:")


@pytest.mark.parametrize("value", ["/data/x.jsonl", "/data/a b.jsonl", "/data/it's.jsonl"])
def test_hydra_values_round_trip(tmp_path, value):
    cfg = compose_plain([f"experiment={GSM8K_EXP}", f"dataset.test_files={prefetch.hydra_value([value])}"])
    assert cfg["dataset"]["test_files"] == value
    cfg = compose_plain([f"experiment={GSM8K_EXP}", f"dataset.train_files={prefetch.hydra_value([value, '/b.jsonl'])}"])
    assert cfg["dataset"]["train_files"] == [value, "/b.jsonl"]
