"""The real Hydra config, composed and shrunk for tests, and the shared data beside the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"

from pods.schema import register  # noqa: E402

register()  # the `_schema` and `<group>/_<shape>` nodes the YAML files build on


def compose_each_once() -> None:
    """``pods.compose.compose_plain`` memoised for this test process: one command line (overrides, config, job name,
    and the ``PODS_``/``SLURM_``/``WORLD_SIZE`` variables the tree reads) is composed by Hydra once (0.2-0.4 s each;
    several tests compose every experiment file), and each caller gets its own deep copy. Every caller imports the
    function when it calls it (``pods.figures``, ``pods.launch``, ``scripts/prefetch.py``, ``scripts/tiny_model.py``,
    ``compose`` below), so they all get the memo; ``conf/`` is not written while the tests run."""
    import copy
    import functools

    from pods import compose as module

    if getattr(module.compose_plain, "memoised", False):
        return
    plain = module.compose_plain

    @functools.cache
    def once(overrides: tuple, config_name: str, job_name: str, env: tuple) -> dict:
        return plain(list(overrides), config_name=config_name, job_name=job_name)

    def compose_plain(overrides: list[str] | None = None, config_name: str = "config", job_name: str = "pods") -> dict:
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("PODS_", "SLURM_", "WORLD_SIZE"))))
        return copy.deepcopy(once(tuple(overrides or []), config_name, job_name, env))

    compose_plain.memoised = True
    compose_plain.__doc__ = plain.__doc__
    module.compose_plain = compose_plain


compose_each_once()
SHARED = Path(os.environ.get("PODS_SHARED", ROOT.parent / "shared"))
# the required keys of a whole algorithm section (GRPO, n = m = 2): ``complete(Algorithm, ALGORITHM, key=value)``
ALGORITHM = {"name": "grpo", "n": 2, "m": 2, "rule": "all"}


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


def need_shared(*parts: str) -> Path:
    """``SHARED/<parts>`` (the data kept beside the repository: task data, the authors' released curves); skips the
    calling test, naming the missing path, when it is absent (a clone used elsewhere: set PODS_SHARED)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found: the shared data directory (PODS_SHARED, default ../shared beside the repo) lacks it")
    return path
