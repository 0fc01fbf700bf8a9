"""Command line: ``python -m pods.train [experiment=NAME] [overrides]`` (Hydra; ``-m`` for sweeps).

Before Hydra starts a run (and makes its directory), ``preflight`` composes every run the command asks for (a
sweep: each combination) with Hydra's compose API and checks it: the schema (``pods.schema``), the cross-field
rules (``pods.config``) and, for a run on this machine, the machine (``pods.preflight``). A bad input exits with
code 2 and one line naming the key. The run itself gets the validated plain dict in ``pods.loop.train``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from pods.compose import CONF, compose_job, expand, hydra_context, job_dict, parse, to_plain
from pods.errors import ConfigError
from pods.numerics import pin
from pods.schema import Root, register

register()  # the schema's defaults as the config nodes conf/ builds on (`_schema`, `<group>/_<shape>`)

MAX_CHECKED_JOBS = 512  # a larger sweep is checked job by job as it runs


def fail(e: Exception) -> None:
    print(f"pods: config error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)


def check(cfg: dict, machine: bool = True) -> Root:
    """Schema, cross-field rules and (``machine``) this machine's devices, files and hub access; the completed config."""
    from pods.config import validate
    from pods.preflight import check_environment

    cfg = validate(cfg)  # the schema, then the cross-field rules
    if machine:
        check_environment(cfg)
    return cfg


def preflight(argv: list[str]) -> None:
    """Compose and check every job of the command line; ``ConfigError`` on the first bad one. Only flags Hydra
    runs jobs with are understood (``-m``); with any other flag (``--cfg``, ``--help``, ...) Hydra decides alone."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return
    overrides = [a for a in argv if a not in ("-m", "--multirun")]
    sweeps = [o for o, parsed in zip(overrides, parse(overrides)) if parsed.is_sweep_override()]
    if sweeps and not multirun:
        raise ConfigError(f"{sweeps[0]}: several values need a sweep: add -m (--multirun)")
    with hydra_context("train"):
        if not multirun:
            check(job_dict(compose_job(overrides)))
            return
        first = compose_job([o for o in overrides if o not in sweeps])
        params = [f"{k}={v}" for k, v in (OmegaConf.select(first, "hydra.sweeper.params") or {}).items()]
        for job in expand(params + overrides)[:MAX_CHECKED_JOBS]:
            check(job_dict(compose_job(job)), machine=False)  # a sweep may run elsewhere (SLURM): each job checks its machine


def suite(cfg: Root, run_dir: str) -> None:
    """``eval.suite``: the finished run's final weights on a benchmark suite (``pods-eval``), by the process that owns
    the run; written to ``<run_dir>/eval/<suite>/``."""
    import os

    ev = cfg.eval
    if ev.suite is None or os.environ.get("RANK", "0") != "0" or not (Path(run_dir) / "final").is_dir():
        return
    from pods.eval.cli import main as pods_eval

    args = [str(run_dir), "--suite", ev.suite, "--engine", ev.suite_engine, "--device", cfg.hardware.device]
    if pods_eval([*args, "--dtype", cfg.hardware.dtype, *ev.suite_overrides]) != 0:
        fail(ConfigError(f"eval.suite: the suite evaluation of {run_dir} failed (above)"))


@hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from pods.log import setup
    from pods.loop import train

    log = setup()
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        plain = check(to_plain(cfg))
        last = train(plain, run_dir)
    except (ConfigError, FileNotFoundError) as e:
        fail(e)
    suite(plain, run_dir)
    log.info(f"run directory: {run_dir}  final eval accuracy: {last.get('accuracy', float('nan')):.3f}")
    return last.get("accuracy")


def main() -> float | None:
    """``pods-train``: check the command line's runs, then let Hydra run them."""
    pin()  # the CPU numerics, before anything loads torch (pods.numerics)
    try:
        preflight(sys.argv[1:])
    except ConfigError as e:
        fail(e)
    return run()


if __name__ == "__main__":
    main()
