"""Command line: ``python -m pods.train [experiment=NAME] [overrides]`` (Hydra; ``-m`` for sweeps).

Before Hydra starts a run (and makes its directory), ``preflight`` composes every run the command asks for (a
sweep: each combination) with Hydra's compose API and checks it: the schema (``pods.schema``), the cross-field
rules (``pods.config``) and, for a run on this machine, the machine (``pods.preflight``). A bad input exits with
code 2 and one line naming the key. A resume (``train.resume``) is checked there against each job's run directory
(``pods.resume``), before Hydra writes into it; a finished single run only says so. The run itself gets the
validated ``Root`` in ``pods.loop.train`` (checked once: ``check`` remembers what it validated).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from omegaconf import DictConfig, OmegaConf, read_write

from pods import resume
from pods.compose import CONF, compose_job, expand, hydra_context, job_dict, parse, to_plain
from pods.errors import ConfigError, ServerError
from pods.numerics import pin
from pods.schema import Root, register

register()  # the schema's defaults as the config nodes conf/ builds on (`_schema`, `<group>/_<shape>`)

MAX_CHECKED_JOBS = 512  # a larger sweep is checked job by job as it runs


def stop(message: str, code: int) -> NoReturn:
    """End the process with one line on stderr, ``pods: <message>``, and exit ``code``: no traceback."""
    print(f"pods: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def fail(e: Exception) -> NoReturn:
    """Bad input (a config, a missing file): exit 2 before anything loads, or at the end of a run."""
    stop(f"config error: {e}", 2)


def kept_work(run_dir: str) -> str:
    """What a run stopped by a failure keeps: its last checkpoint and how to continue from it."""
    last = resume.latest(Path(run_dir) / "checkpoints")
    if last is None:
        return f"no checkpoint was written yet: {run_dir} holds the rows logged so far"
    return f"{run_dir} keeps {last.name}: the same command with hydra.run.dir={run_dir} train.resume=auto continues from it"


CHECKED: dict[str, tuple[Root, bool]] = {}  # plain config -> (its Root, machine checked): a run validates once


def check(cfg: dict, machine: bool = True) -> Root:
    """Schema, cross-field rules and (``machine``) this machine's devices, files and hub access; the completed config.
    A config checked before in this process (preflight's, then the run Hydra composes) is not validated again."""
    from pods.config import validate
    from pods.preflight import check_environment

    key = json.dumps(cfg, sort_keys=True, default=str)
    root, machine_done = CHECKED.get(key) or (validate(cfg), False)  # the schema, then the cross-field rules
    if machine and not machine_done:
        check_environment(root)
    CHECKED[key] = (root, machine or machine_done)
    return root


def output_dir(job: DictConfig, key: str) -> None:
    """``ConfigError`` in one line unless the job's ``key`` (``hydra.run.dir``, ``hydra.sweep.dir``) is a folder this
    process can create or write in: before Hydra makes it and the run writes its config there."""
    from pods.files import writable

    try:
        path = OmegaConf.select(job, key, throw_on_resolution_failure=True)
    except Exception:  # noqa: BLE001 - an interpolation the resolvers cannot resolve here: Hydra's own error later
        return
    if path is not None:
        writable(path, key, directory=True)


def preflight(argv: list[str]) -> str | None:
    """Compose and check every job of the command line; ``ConfigError`` on the first bad one. Only flags Hydra
    runs jobs with are understood (``-m``); with any other flag (``--cfg``, ``--help``, ...) Hydra decides alone.
    A resume is checked against its run directory here, before Hydra writes into it (``pods.resume``); a single
    run that is finished returns what to say instead of running."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    overrides = [a for a in argv if a not in ("-m", "--multirun")]
    sweeps = [o for o, parsed in zip(overrides, parse(overrides)) if parsed.is_sweep_override()]
    if sweeps and not multirun:
        raise ConfigError(f"{sweeps[0]}: several values need a sweep: add -m (--multirun)")
    with hydra_context("train"):
        if not multirun:
            job = compose_job(overrides)
            output_dir(job, "hydra.run.dir")
            root = check(job_dict(job))
            bench = suite_of(root)
            run_dir = OmegaConf.select(job, "hydra.run.dir")
            end = resume.check(root, run_dir)
            return None if end is None or suite_missing(bench, run_dir) else resume.finished_line(run_dir, end)
        first = compose_job([o for o in overrides if o not in sweeps])
        output_dir(first, "hydra.sweep.dir")
        params = [f"{k}={v}" for k, v in (OmegaConf.select(first, "hydra.sweeper.params") or {}).items()]
        jobs = expand(params + overrides)[:MAX_CHECKED_JOBS]
        for num, args in enumerate(jobs):  # a sweep may run elsewhere (SLURM): each job checks its machine
            job = compose_job(args)
            root = check(job_dict(job), machine=False)
            suite_of(root, machine=False)
            with read_write(job.hydra.job):
                job.hydra.job.num = num  # the job's directory, as Hydra's basic sweeper will name it
            resume.check(root, Path(job.hydra.sweep.dir) / str(job.hydra.sweep.subdir))  # a finished job says so when it runs
    return None


def rank0() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"


def suite_options(cfg: Root):
    """How ``eval.suite`` generates: ``eval.suite_engine`` (a dense engine, whatever engine trained) on the run's device."""
    from pods.eval.run import Options

    return Options(engine=cfg.eval.suite_engine, device=cfg.hardware.device, dtype=cfg.hardware.dtype)


def suite_of(cfg: Root, machine: bool = True):
    """``eval.suite`` composed and checked with the Hydra initialised here (the app, or preflight's context), and
    (``machine``) its engine's package present: a bad name or override is one line before anything trains."""
    if cfg.eval.suite is None:
        return None
    from pods.eval.benchmarks import compose_suite
    from pods.eval.run import check_options

    if machine:
        check_options(suite_options(cfg))
    return compose_suite(cfg.eval.suite, cfg.eval.suite_overrides)


def suite_missing(bench, run_dir: str) -> bool:
    """A finished run whose end-of-run suite never finished (a job cut by its time limit during the suite): its
    ``final/`` is there but not ``eval/<suite>/summary.json``. The same command again runs the suite only."""
    run = Path(run_dir)
    return bench is not None and (run / "final").is_dir() and not (run / "eval" / bench.name / "summary.json").exists()


def prepare_suite(cfg: Root) -> tuple | None:
    """(suite, {benchmark: examples}) for the end of the run, composed and loaded before it trains (a missing file:
    one line now, not after the run), on every rank (each evaluates a share); None without ``eval.suite``."""
    bench = suite_of(cfg)
    if bench is None:
        return None
    from pods.eval.run import load_suite, suite_prompt

    return bench, load_suite(bench, suite_prompt(bench, cfg.model_dump()))


def suite(cfg: Root, prepared: tuple | None, run_dir: str) -> None:
    """The end of the run on every rank: the process group destroyed (``pods.distributed.close``), then ``eval.suite``:
    the final weights on the prepared suite (``pods.eval.run.evaluate_suite``, as ``pods-eval``), written to
    ``<run_dir>/eval/<suite>/``: after several ranks or with vLLM each rank's share in a clean process, merged by
    rank 0 (``pods.eval.shards``); one process with the HF engine evaluates here, as before."""
    from pods.distributed import close
    from pods.eval import shards

    out = Path(run_dir) / "eval" / prepared[0].name if prepared else None
    if out is not None and rank0():
        shards.clear(out)  # before the barrier: no rank can read a share left by an earlier attempt
    where = close()
    if prepared is None or not (Path(run_dir) / "final").is_dir():
        return
    bench, data = prepared
    options = suite_options(cfg)
    try:
        if shards.clean_process(where[2], options):
            summary = shards.evaluate_shared(bench, run_dir, options, data, out, where)
        else:
            from pods.eval.run import evaluate_suite
            from pods.eval.weights import resolve

            summary = evaluate_suite(bench, resolve(run_dir), options, out, data)
    except ConfigError as e:
        fail(ConfigError(f"eval.suite: the suite evaluation of {run_dir} failed: {e}"))
    except RuntimeError as e:
        stop(f"eval.suite: the suite evaluation of {run_dir} failed: {e}", 1)
    if summary is not None:  # rank 0
        print((out / "table.md").read_text())
        print(f"-> {out}", flush=True)


@hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from pods.log import setup
    from pods.loop import train

    log = setup()
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        plain = check(to_plain(cfg))
        end = resume.check(plain, run_dir)  # before anything loads: a resume with other settings is refused
        if end is not None:  # a finished run (a re-run sweep's job): it says so, and nothing of it changes
            prepared = prepare_suite(plain)
            if prepared is not None and suite_missing(prepared[0], run_dir):  # but a suite cut short runs again
                suite(plain, prepared, run_dir)
            elif rank0():
                print(resume.finished_line(run_dir, end), flush=True)
            return end.get("accuracy")
        prepared = prepare_suite(plain)  # before the run: Hydra is initialised here, so it composes with this one
        last = train(plain, run_dir)
    except (ConfigError, FileNotFoundError) as e:
        fail(e)
    except ServerError as e:  # a server died, hung or refused mid-run: one line, and where the work is kept
        stop(f"{e}; {kept_work(run_dir)}", 1)
    suite(plain, prepared, run_dir)
    log.info(f"run directory: {run_dir}  final eval accuracy: {last.get('accuracy', float('nan')):.3f}")
    return last.get("accuracy")


def main(argv: list[str] | None = None) -> float | None:
    """``pods-train``: check the command line's runs, then let Hydra run them. ``argv``: the arguments after the
    program's name (None: ``sys.argv[1:]``); given, they are what Hydra reads too, so a test runs the command in-process."""
    pin()  # the CPU numerics, before anything loads torch (pods.numerics)
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        finished = preflight(argv)
    except ConfigError as e:
        fail(e)
    if finished:  # a single run resumed after its end: nothing runs, Hydra writes nothing into it
        if rank0():
            print(finished, flush=True)
        return None
    saved, sys.argv = sys.argv, [sys.argv[0], *argv]  # @hydra.main reads sys.argv
    try:
        return run()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main()
