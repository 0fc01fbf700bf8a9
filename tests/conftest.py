"""Test setup: offline hub/datasets/wandb, 2 torch threads that sleep when idle, pinned numerics, the session fixtures.
The helpers tests import are in ``support/``.

The tiers are markers, not folders (``distributed/`` and ``vllm_cpu/`` hold fast tests too): ``make test`` runs what is
not ``slow``, ``slurm`` or ``gpu``; there a command (``python -m pods.train``, ``pods.eval``, ``pods.export``, a script)
runs in-process through its ``main(argv)`` or as ``__main__`` (``support/doors.py``), and a run trains a few steps of
the tiny model at most. Each command keeps one test of its real process, in the ``slow`` tier unless it is cheap (a console
script whose imports are lazy, a script that loads no torch)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "2")
# OpenMP threads that wait for work sleep instead of spinning (libgomp's OMP_WAIT_POLICY): make test-all runs 2 workers,
# each with 2-thread runs and 2-rank launches, on 2 cores, where a spinning team holds a core its peer needs (two
# 2-thread pods.train runs at once here: 139-151 s spinning, 73-79 s passive, load 5-9); the same threads split the
# same sums, so every number is the same (identical checkpoints and metrics measured); subprocesses inherit it
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if os.environ.get("PODS_NUMERICS", "pinned") != "native":  # pinned CPU numerics (pods.numerics); make test-isa sets native + one ISA
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    os.environ.setdefault("MKL_CBWR", "AVX2")
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    os.environ.setdefault("MKL_DYNAMIC", "FALSE")
    os.environ.setdefault("OMP_DYNAMIC", "FALSE")

import pytest  # noqa: E402

from support.config import need_shared  # noqa: E402


def pytest_configure(config):
    """With pytest-xdist installed, ``-n N --dist loadgroup`` keeps the tests that share something on one worker
    (support/xdist_groups.py)."""
    if config.pluginmanager.hasplugin("xdist"):
        from support import xdist_groups

        config.pluginmanager.register(xdist_groups, "pods_xdist_groups")


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """The tiny model directory (built once into the repo's .cache, then reused)."""
    from pods.tiny import ensure_tiny

    return ensure_tiny()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared data directory; the test skips, saying so, when it is absent."""
    return need_shared()


def pytest_collection_modifyitems(config, items):
    """``gpu``-marked tests need CUDA: skipped, saying so, without it (``make gpu-check`` on a GPU machine). The marker,
    not the keyword: every test under ``tests/gpu/`` has the keyword "gpu" (its folder), and most of
    ``test_bench_gpu.py`` runs on a CPU."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make gpu-check)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
