"""Command line: ``python -m pods.train [experiment=NAME] [overrides]`` (Hydra; ``-m`` for sweeps).

The Hydra config stops here: it is resolved to a plain dict and handed to ``pods.loop.train``.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from pods.config import ConfigError


def to_plain(cfg: DictConfig) -> dict:
    """Resolve every interpolation; a missing required value (???) raises here, naming the key."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from pods.loop import train

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        last = train(to_plain(cfg), run_dir)
    except (ConfigError, FileNotFoundError) as e:
        print(f"pods: config error: {e}", file=sys.stderr)
        sys.exit(2)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[pods] run directory: {run_dir}  final eval accuracy: {last.get('accuracy', float('nan')):.3f}", flush=True)
    return last.get("accuracy")


if __name__ == "__main__":
    main()
