"""``pods-eval`` / ``python -m pods.eval``: evaluate a model on a benchmark suite.

    pods-eval MODEL [suite.KEY=VALUE ...] [--suite pods] [--checkpoint step_000100.pt|latest|base] [--engine hf]
              [--out DIR] [--device cpu] [--dtype float32] [--max-batch 64]

MODEL is a model directory, a hub id, or a pods run directory (its final/ weights, a checkpoint, a LoRA adapter over
its base). Suites: ``conf/suite/*.yaml`` (their benchmarks: ``conf/benchmark/*.yaml``); any suite key is overridden
as ``suite.samples=4``, ``suite.only=[math500]``, ``suite.benchmarks.math500.files=/data/math500.jsonl``.
Writes ``<out>/eval/<suite>/``: summary.json (per benchmark and macro-averaged avg@n, pass@k, maj@k), table.md,
samples.jsonl (one row per completion) and config.json. ``--out`` defaults to the run directory, else ".".
Bad input (an unknown suite or benchmark, k > samples, a run directory without weights, a directory with no model,
a corrupt checkpoint, a hub id offline, an ``--out`` that is a file or cannot be written) is one line and exit code 2,
before any model loads and before anything is written. This module only parses the command line into typed arguments (a
``Suite``, a ``Target``, ``Options``) for ``pods.eval.run.evaluate_suite``, which a training run's ``eval.suite`` calls
too; ``--engine`` is a name in ``pods.engines.ENGINES``.

``--each-checkpoint RUN`` evaluates the model a run started from (step 0), every checkpoint (and its final/), one summary each under
``OUT/eval/<suite>/checkpoints/<point>/`` and a curve over them (curve.csv, curve.png), here (``--launcher local``)
or as one SLURM job each (``--launcher submitit``); with ``--checkpoint POINT`` only that one (``pods.eval.each``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pods.errors import ConfigError
from pods.numerics import pin

USAGE = (
    "pods-eval MODEL [suite.KEY=VALUE ...] [--suite NAME] [--checkpoint FILE|latest|base] [--engine NAME] [--out DIR] [...]\n"
    "       pods-eval --each-checkpoint RUN [suite.KEY=VALUE ...] [--launcher local|submitit] [...]"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from pods.engines import ENGINES

    p = argparse.ArgumentParser(prog="pods-eval", usage=USAGE, description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", metavar="MODEL", help="a model directory, a hub id, or a pods run directory (required)")
    p.add_argument("overrides", nargs="*", metavar="suite.KEY=VALUE", help="suite overrides (optional)")
    p.add_argument("--suite", default="pods", help="conf/suite/NAME.yaml (default: pods)")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="run directory: a file under checkpoints/, 'latest', or 'base' (the model it started from); default: its final/ when the "
        "run saved one (train.save_final=true or train.checkpoint_at_end=weights), else its newest checkpoint",
    )
    p.add_argument("--engine", default="hf", choices=ENGINES.names(), help="generation engine (pods.engines.ENGINES; vllm: when installed)")
    p.add_argument("--out", type=Path, default=None, help="writes OUT/eval/<suite>/ (default: the run directory, else .)")
    p.add_argument("--device", default=None, help="default: cpu (--launcher submitit: the run's hardware.device)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default: float32 (submitit: the run's)")
    p.add_argument("--max-batch", type=int, default=64, help="sequences per generate call (hf, sparse_hf)")
    p.add_argument("--each-checkpoint", action="store_true", help="MODEL is a run: every checkpoint, one summary each, a curve")
    p.add_argument("--launcher", default="local", choices=["local", "submitit"], help="--each-checkpoint: here, or one SLURM job each")
    args = p.parse_intermixed_args(argv)  # a required positional before an optional nargs="*" one would name both missing
    if args.model is None:
        p.error("the following argument is required: MODEL")
    return args


def main(argv: list[str] | None = None) -> int:
    pin()  # the CPU numerics, before anything loads torch (pods.numerics)
    args = parse_args(argv)
    from pods.eval.benchmarks import compose_suite
    from pods.eval.run import Options, check_options, check_target, evaluate_suite, load_suite, suite_prompt
    from pods.eval.weights import resolve
    from pods.files import writable
    from pods.schema import validated

    try:  # everything checked before a model loads
        suite = compose_suite(args.suite, args.overrides)
        given = {"engine": args.engine, "device": args.device or "cpu", "dtype": args.dtype or "float32", "max_batch": args.max_batch}
        options = validated(Options, given, "")
        check_options(options)
        if args.out is not None:
            writable(args.out, "--out", directory=True)
        if args.each_checkpoint:
            return each(args, suite, options)
        target = resolve(args.model, args.checkpoint)
        check_target(target, options)
        out = writable((args.out or target.run_dir or Path(".")) / "eval" / suite.name, "--out", directory=True)
        data = load_suite(suite, suite_prompt(suite, target.run_cfg))
        evaluate_suite(suite, target, options, out, data)  # what it refuses (weights that do not fit) it refuses before writing
    except ConfigError as e:
        print(f"pods-eval: {e}", file=sys.stderr)
        return 2
    print((out / "table.md").read_text())
    print(f"-> {out}")
    return 0


def each(args: argparse.Namespace, suite, options) -> int:
    """``--each-checkpoint`` (``pods.eval.each``): 0 when every point was evaluated, 1 when one failed (said above)."""
    from pods.eval.each import device_args, evaluate_each, select, submit_each, write_curve
    from pods.eval.run import load_suite, suite_prompt
    from pods.eval.weights import run_config
    from pods.files import writable

    run = Path(args.model)
    chosen = select(run, args.checkpoint)
    root = writable((args.out or run) / "eval" / suite.name, "--out", directory=True)
    if args.launcher == "local":
        data = load_suite(suite, suite_prompt(suite, run_config(run)))
        failed = evaluate_each(run, suite, options, root, chosen, data)
    else:
        job = [*args.overrides, "--suite", args.suite, "--engine", args.engine, *device_args(run, args.device, args.dtype)]
        job += ["--max-batch", str(args.max_batch), "--out", str(args.out or run)]
        failed = submit_each(run, root, chosen, job, args.launcher)
    curve = None if args.checkpoint else write_curve(root, chosen)  # one point (a job): the submitter writes the curve
    if curve:
        print(curve.read_text())
        print(f"-> {curve}, {curve.with_suffix('.png')}")
    if failed:
        print(f"pods-eval: not evaluated: {', '.join(failed)} (the same command again evaluates only those)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
