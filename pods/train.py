"""Command line: ``python -m pods.train [experiment=NAME] [overrides]`` (Hydra; ``-m`` for sweeps): compose, check,
run, and the exit codes (``stop``, ``fail``).

Before Hydra starts a run (and makes its directory), ``preflight`` composes every run the command asks for (a
sweep: each combination) with Hydra's compose API and checks it: the schema (``pods.schema``), the cross-field
rules (``pods.config``) and, for a run on this machine, the machine (``pods.preflight``). A bad input exits with
code 2 and one line naming the key. A resume (``train.resume``) is decided there against each job's run directory
(``pods.resume.ahead``), before Hydra writes into it; a finished single run only says so, and a fresh run into a
directory holding a run is refused there (``train.start_over=true``: moved aside). A config error found once Hydra
made a new run directory removes it again (``undo``); a finished sweep job puts back Hydra's .hydra/ files
(``put_back``). ``--help`` prints the pods page (``pods.usage``); Ctrl-C is a stop request (``pods.signals``). The run itself gets the
validated ``Root`` (``check`` remembers what it validated) and the resume decided for it: one validation and one
resume decision per run. The end-of-run suite (``eval.suite``) is ``pods.eval.end``'s.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from omegaconf import DictConfig, OmegaConf, read_write

from pods import resume
from pods.compose import CONF, compose_job, expand, hydra_context, job_dict, parse, to_plain
from pods.errors import ConfigError, ServerError
from pods.eval import end
from pods.numerics import pin
from pods.schema import Root, register

register()  # the schema's defaults as the config nodes conf/ builds on (`_schema`, `<group>/_<shape>`)

MAX_CHECKED_JOBS = 512  # a larger sweep is checked job by job as it runs


def stop(message: str, code: int) -> NoReturn:
    """End the process with one line on stderr, ``pods: <message>``, and exit ``code``: no traceback. Under torchrun
    every rank exits ``code`` and only rank 0 prints the line (the others would repeat it)."""
    if end.rank0():
        print(f"pods: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def fail(e: Exception) -> NoReturn:
    """Bad input (a config, a missing file): exit 2 before anything loads, or at the end of a run."""
    stop(f"config error: {e}", 2)


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
            bench = end.suite_of(root)
            run_dir = OmegaConf.select(job, "hydra.run.dir")
            new_dir(run_dir)
            done = resume.ahead(root, run_dir)  # the run's one decision, kept for it (pods.resume)
            return None if done is None or end.missing(bench, run_dir) else resume.finished_line(run_dir, done)
        first = compose_job([o for o in overrides if o not in sweeps])
        output_dir(first, "hydra.sweep.dir")
        params = [f"{k}={v}" for k, v in (OmegaConf.select(first, "hydra.sweeper.params") or {}).items()]
        jobs = expand(params + overrides)[:MAX_CHECKED_JOBS]
        for num, args in enumerate(jobs):  # a sweep may run elsewhere (SLURM): each job checks its machine
            job = compose_job(args)
            root = check(job_dict(job), machine=False)
            end.suite_of(root, machine=False)
            with read_write(job.hydra.job):
                job.hydra.job.num = num  # the job's directory, as Hydra's basic sweeper will name it
            job_dir = Path(job.hydra.sweep.dir) / str(job.hydra.sweep.subdir)
            new_dir(job_dir)
            if resume.ahead(root, job_dir) is not None:  # kept for the job: a finished one says so when it runs,
                hydra_files(job_dir)  # and its .hydra/ files are put back as they were (Hydra rewrites them first)
    return None


NEW: set[str] = set()  # run directories that did not exist before this command (pods.train.undo)


def new_dir(run_dir: str | Path | None) -> None:
    if run_dir is not None and not Path(run_dir).exists():
        NEW.add(str(Path(run_dir).resolve()))


HYDRA_FILES: dict[str, dict[str, bytes]] = {}  # a finished sweep job's .hydra/ files, as preflight found them


def hydra_files(run_dir: str | Path) -> None:
    d = Path(run_dir) / ".hydra"
    HYDRA_FILES[str(Path(run_dir).resolve())] = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} if d.is_dir() else {}


def put_back(run_dir: str) -> None:
    """A finished sweep job changes no file of its run: Hydra's .hydra/ files written for this job go back to the bytes
    preflight read (a finished single run never reaches Hydra)."""
    saved = HYDRA_FILES.get(str(Path(run_dir).resolve()))
    if saved is None or not end.rank0():
        return
    d = Path(run_dir) / ".hydra"
    for p in d.iterdir() if d.is_dir() else []:
        if p.name not in saved:
            p.unlink()
    for name, data in saved.items():
        (d / name).write_bytes(data)


def undo(run_dir: str) -> None:
    """A config error found after Hydra made a new run directory (its .hydra/ and train.log) and before the run wrote its
    record: the directory goes again, so the place is as it was before the command (a later run starts there afresh)."""
    import shutil

    path = Path(run_dir).resolve()
    if end.rank0() and str(path) in NEW and not any((path / name).exists() for name in resume.RECORD):
        shutil.rmtree(path, ignore_errors=True)


def finish(cfg: Root, prepared: tuple | None, run_dir: str) -> None:
    """The end-of-run suite (``pods.eval.end.evaluate``); its failure ends the process: a bad input 2, else 1."""
    try:
        end.evaluate(cfg, prepared, run_dir)
    except ConfigError as e:
        fail(e)
    except RuntimeError as e:
        stop(str(e), 1)


@hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from pods.log import setup
    from pods.loop import train

    log = setup()
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        root = check(to_plain(cfg))  # preflight's validation, remembered: not validated again
        done = resume.kept(root, run_dir)  # decided by preflight before Hydra wrote here (else now); the loop takes it
        prepared = end.prepare(root)  # before the run: Hydra is initialised here, so it composes with this one
        if done is not None:  # a finished run (a re-run sweep's job): it says so, and nothing of it changes
            if prepared is not None and end.missing(prepared[0], run_dir):  # but a suite cut short runs again
                finish(root, prepared, run_dir)
            elif end.rank0():
                put_back(run_dir)
                print(resume.finished_line(run_dir, done), flush=True)
            return done.get("accuracy")
        last = train(root, run_dir)
    except (ConfigError, FileNotFoundError) as e:
        undo(run_dir)
        fail(e)
    except ServerError as e:  # a server died, hung or refused mid-run: one line, and where the work is kept
        stop(f"{e}; {resume.kept_work(run_dir)}", 1)
    except KeyboardInterrupt:  # a second Ctrl-C (pods.signals), or one before the loop took over Ctrl-C
        stop(f"interrupted (Ctrl-C): no checkpoint written now; {resume.kept_work(run_dir)}", 130)
    finish(root, prepared, run_dir)
    if last.get("stopped"):  # SIGTERM, SLURM's warning or a first Ctrl-C: checkpointed, then ended
        log.info(f"stopped by {last['stopped']}: {resume.kept_work(run_dir)}")
        if last["stopped"] == "SIGINT":
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # ended: a late Ctrl-C in the interpreter's teardown changes nothing
            sys.exit(130)  # as a shell expects of Ctrl-C: a loop of commands stops too
        return None
    log.info(f"run directory: {run_dir}  final eval accuracy: {last.get('accuracy', float('nan')):.3f}")
    return last.get("accuracy")


def main(argv: list[str] | None = None) -> float | None:
    """``pods-train``: check the command line's runs, then let Hydra run them. ``argv``: the arguments after the
    program's name (None: ``sys.argv[1:]``); given, they are what Hydra reads too, so a test runs the command in-process."""
    pin()  # the CPU numerics, before anything loads torch (pods.numerics)
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("--help", "-h") for a in argv):  # the pods page, not Hydra's dump of every key (--hydra-help: Hydra's)
        from pods.usage import page

        print(page())
        return None
    resume.forget()  # this command decides its runs afresh
    NEW.clear()
    HYDRA_FILES.clear()
    try:
        finished = preflight(argv)
    except ConfigError as e:
        fail(e)
    except KeyboardInterrupt:
        stop("interrupted (Ctrl-C) before the run started: nothing was written", 130)
    if finished:  # a single run resumed after its end: nothing runs, Hydra writes nothing into it
        if end.rank0():
            print(finished, flush=True)
        return None
    saved, sys.argv = sys.argv, [sys.argv[0], *argv]  # @hydra.main reads sys.argv
    try:
        return run()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main()
