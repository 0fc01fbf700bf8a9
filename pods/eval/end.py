"""A training run's end-of-run suite (``eval.suite``): composed and checked before the run trains (``suite_of``,
``prepare``), then, after the run, the final weights evaluated on it (``evaluate``) as ``pods-eval`` evaluates them
(``pods.eval.run.evaluate_suite``), written to ``<run_dir>/eval/<suite>/``. A finished run whose suite was cut short
(``missing``) runs the suite alone when its command is given again. ``pods.train`` calls these; the exit codes are
its own (a ``ConfigError`` here: 2; a ``RuntimeError``: 1)."""

from __future__ import annotations

import os
from pathlib import Path

from pods.errors import ConfigError
from pods.schema import Root


def rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def options(cfg: Root, bench=None):
    """How ``eval.suite`` generates: ``eval.suite_engine`` (a dense engine, whatever engine trained) on the run's device;
    a vLLM engine with the suite's longest sequence (``bench``'s prompt bound + its largest completion; without a prompt
    bound the child measures its prompts, ``pods.eval.run.context_length``), never the model's whole context, and the
    profile's share of a GPU it has alone (``hardware.vllm_alone_share``), not vLLM's default 0.5."""
    from pods.eval.benchmarks import plan_for, selected
    from pods.eval.run import Options
    from pods.schema.rollouts import ROLLOUTS

    hw, engine = cfg.hardware, cfg.eval.suite_engine
    how = Options(engine=engine, device=hw.device, dtype=hw.dtype)
    if "max_model_len" not in ROLLOUTS[engine].model_fields:  # an engine that sizes no cache of its own (HF)
        return how
    length = None
    if bench is not None and bench.max_prompt_length is not None:
        length = bench.max_prompt_length + max(plan_for(bench, name).max_tokens for name in selected(bench))
    return how.model_copy(update={"max_model_len": length, "gpu_memory_utilization": hw.vllm_alone_share})


def trainer_gone(device: str) -> None:
    """The trainer's engines, backend and policy (``pods.engines.base.remember``) are gone before the suite loads a
    model: on CUDA one still alive is a ``RuntimeError`` in one line (its memory would stay taken under the suite's
    engine); on CPU a warning."""
    from pods.engines.base import alive
    from pods.log import get

    left = alive()
    if not left:
        return
    line = f"the trainer's {', '.join(left)} still alive after training: its memory is not given back to the suite"
    if device.startswith("cuda"):
        raise RuntimeError(line)
    get(__name__).warning(line)


def suite_of(cfg: Root, machine: bool = True):
    """``eval.suite`` composed and checked with the Hydra initialised here (the app, or preflight's context), and
    (``machine``) its engine's package present: a bad name or override is one line before anything trains."""
    if cfg.eval.suite is None:
        return None
    from pods.eval.benchmarks import compose_suite
    from pods.eval.run import check_options

    if machine:
        check_options(options(cfg))
    return compose_suite(cfg.eval.suite, cfg.eval.suite_overrides)


def missing(bench, run_dir: str | Path) -> bool:
    """A finished run whose end-of-run suite never finished (a job cut by its time limit during the suite): its
    ``final/`` is there but not ``eval/<suite>/summary.json``. The same command again runs the suite only."""
    run = Path(run_dir)
    return bench is not None and (run / "final").is_dir() and not (run / "eval" / bench.name / "summary.json").exists()


def prepare(cfg: Root) -> tuple | None:
    """(suite, {benchmark: examples}) for the end of the run, composed and loaded before it trains (a missing file:
    one line now, not after the run), on every rank (each evaluates a share); None without ``eval.suite``."""
    bench = suite_of(cfg)
    if bench is None:
        return None
    from pods.eval.run import load_suite, suite_prompt

    return bench, load_suite(bench, suite_prompt(bench, cfg.model_dump()))


def evaluate(cfg: Root, prepared: tuple | None, run_dir: str) -> None:
    """The end of the run on every rank: the process group destroyed (``pods.distributed.close``), then ``eval.suite``:
    the final weights on the prepared suite (``pods.eval.run.evaluate_suite``, as ``pods-eval``), written to
    ``<run_dir>/eval/<suite>/``: after several ranks or with vLLM each rank's share in a clean process, merged by
    rank 0 (``pods.eval.shards``); one process with the HF engine evaluates here. A failure: ``ConfigError`` or
    ``RuntimeError`` in one line naming the run."""
    from pods.distributed import close
    from pods.eval import shards

    out = Path(run_dir) / "eval" / prepared[0].name if prepared else None
    if out is not None and rank0():
        shards.clear(out)  # before the barrier: no rank can read a share left by an earlier attempt
    where = close()
    if prepared is None or not (Path(run_dir) / "final").is_dir():
        return
    bench, data = prepared
    how = options(cfg, bench)
    trainer_gone(how.device)
    try:
        if shards.clean_process(where[2], how):
            summary = shards.evaluate_shared(bench, run_dir, how, data, out, where)
        else:
            from pods.eval.run import evaluate_suite
            from pods.eval.weights import resolve

            summary = evaluate_suite(bench, resolve(run_dir), how, out, data)
    except ConfigError as e:
        raise ConfigError(f"eval.suite: the suite evaluation of {run_dir} failed: {e}") from None
    except RuntimeError as e:
        raise RuntimeError(f"eval.suite: the suite evaluation of {run_dir} failed: {e}") from None
    if summary is not None:  # rank 0
        print((out / "table.md").read_text())
        print(f"-> {out}", flush=True)
