"""Shared test setup: offline hub/datasets/wandb, 2 torch threads, the real Hydra config composed and shrunk."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "2")
if os.environ.get("PODS_NUMERICS", "pinned") != "native":  # pinned CPU numerics (pods.numerics); make test-isa sets native + one ISA
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    os.environ.setdefault("MKL_CBWR", "AVX2")
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    os.environ.setdefault("MKL_DYNAMIC", "FALSE")
    os.environ.setdefault("OMP_DYNAMIC", "FALSE")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

from pods.schema import register  # noqa: E402

register()  # the `_schema` and `<group>/_<shape>` nodes the YAML files build on
SHARED = Path(os.environ.get("PODS_SHARED", ROOT.parent / "shared"))


def compose(overrides: list[str] | None = None, name: str = "config") -> dict:
    """Compose the real config tree with overrides and resolve it to the plain dict ``train`` takes (the package's
    one composition path, ``pods.compose.compose_plain``)."""
    from pods.compose import compose_plain

    return compose_plain(overrides, config_name=name)


def shrink(cfg: dict, steps: int = 2) -> dict:
    """Make any composed config a seconds-long CPU run of the tiny model (the algorithm's n/m are kept)."""
    cfg["train"].update(
        max_steps=steps, time_budget_s=None, prompts_per_step=min(cfg["train"]["prompts_per_step"], 2), checkpoint_every_s=None
    )
    cfg["eval"].update(max_examples=8, repeats=1, every_s=None, every_steps=None)
    cfg["sampling"]["max_tokens"] = min(cfg["sampling"]["max_tokens"], 12)
    cfg["eval"]["max_tokens"] = cfg["sampling"]["max_tokens"]
    cfg["logger"] = {"name": "none"}
    return cfg


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """The tiny model directory (built once into the repo's .cache, then reused)."""
    from pods.tiny import ensure_tiny

    return ensure_tiny()


def need_shared(*parts: str) -> Path:
    """``SHARED/<parts>`` (the data kept beside the repository: task data, the authors' released curves); skips the
    calling test, naming the missing path, when it is absent (a clone used elsewhere: set PODS_SHARED)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found: the shared data directory (PODS_SHARED, default ../shared beside the repo) lacks it")
    return path


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared data directory; the test skips, saying so, when it is absent."""
    return need_shared()


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need CUDA: skipped, saying so, without it (``make gpu-check`` on a GPU machine)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make gpu-check)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
