"""pods as a user installs it: a regular (non-editable) install carries its Hydra config tree, so ``pods-train`` works
from any directory, and a bad input there still stops in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from support.config import ROOT


@pytest.mark.slow
def test_a_non_editable_install_ships_the_config_tree(tmp_path):
    site, elsewhere, src = tmp_path / "site", tmp_path / "elsewhere", tmp_path / "src"
    elsewhere.mkdir()
    shutil.copytree(ROOT / "pods", src / "pods", ignore=shutil.ignore_patterns("__pycache__"))  # a copy: the build leaves build/ behind
    shutil.copy(ROOT / "pyproject.toml", src)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(src)]
    subprocess.run(pip, check=True, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert (site / "pods" / "conf" / "config.yaml").is_file() and (site / "pods" / "conf" / "experiment" / "demo_pods_cpu.yaml").is_file()
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pods.train", *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
        )

    where = subprocess.run(
        [sys.executable, "-c", "import pods; print(pods.__file__)"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert where.stdout.strip().startswith(str(site)), where.stdout  # the installed copy, not the repository
    shown = run("--cfg", "job", "experiment=demo_pods_cpu")
    assert shown.returncode == 0 and "name: grpo_pods" in shown.stdout, shown.stderr[-2000:]
    bad = run("optim.lr=abc")
    assert bad.returncode == 2 and bad.stderr.strip() == "pods: config error: optim.lr must be a number, got 'abc'", bad.stderr[-2000:]
    assert sorted(p.name for p in elsewhere.iterdir()) == []  # no run directory
