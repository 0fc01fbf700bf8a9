"""The shape of a ``slurm/run_async.sbatch`` job, decided before any server starts: how many trainer processes (the
profile's ``hardware.nproc_per_node``) and how many vLLM servers K (``PODS_SERVERS``, else the run's own
``rollout.servers`` count; docs/async.md's sizing rule chooses it, never "every GPU"), checked against the GPUs of a
node, with the trainer's config validated as ``pods.train`` will validate it under that launch (its rules across sections,
with K servers counted: nothing is asked of servers that do not run yet). Prints ``NPROC K``; a shape or config that cannot run is one line and exit 2.

    python scripts/async_shape.py --gpus G [--servers K] [HYDRA OVERRIDES...]
"""

from __future__ import annotations

import argparse
import os
import sys

from pods.compose import compose, compose_plain
from pods.errors import ConfigError


def shape(gpus: int, servers: int | None, overrides: list[str]) -> tuple[int, int]:
    """(trainer processes, servers) of the job; ``ConfigError`` in one line when they do not fit ``gpus`` per node (0:
    not checked, a CPU job) or the trainer's config would be refused under that launch."""
    plain = compose_plain(["rollout=vllm_server", *overrides])
    nproc, count = int(plain["hardware"]["nproc_per_node"]), plain["rollout"]["servers"]
    k = servers or (count if isinstance(count, int) else len(count))
    if gpus and nproc > gpus:
        raise ConfigError(f"hardware.nproc_per_node={nproc} trainer processes but {gpus} GPU(s) per node: sbatch --gpus-per-node={nproc}")
    if gpus and k > gpus:
        raise ConfigError(
            f"{k} vLLM servers (one GPU each) but {gpus} GPU(s) on the servers' node: fewer servers (PODS_SERVERS) or more GPUs"
        )
    if nproc > 1:
        os.environ["WORLD_SIZE"] = str(nproc)  # the trainer runs under torchrun with that many ranks
    compose(["rollout=vllm_server", *overrides, f"rollout.servers={k}", "rollout.port=8000"])  # the trainer's checks, now
    return nproc, k


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="async_shape.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=0, help="GPUs per node (0: a CPU job, not checked)")
    p.add_argument("--servers", type=int, default=None, help="K (default: the run's rollout.servers)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    try:
        nproc, k = shape(args.gpus, args.servers, args.overrides)
    except ConfigError as e:
        print(f"async_shape.py: {e}", file=sys.stderr)
        return 2
    print(nproc, k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
