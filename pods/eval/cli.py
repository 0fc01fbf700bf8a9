"""``pods-eval`` / ``python -m pods.eval``: evaluate a model on a benchmark suite.

    pods-eval MODEL [--suite pods] [--checkpoint step_000100.pt|latest] [--engine hf|vllm] [--out DIR]
              [--device cpu] [--dtype float32] [--max-batch 64] [suite.KEY=VALUE ...]

MODEL is a model directory, a hub id, or a pods run directory (its final/ weights, a checkpoint, a LoRA adapter over
its base). Suites: ``conf/suite/*.yaml`` (their benchmarks: ``conf/benchmark/*.yaml``); any suite key is overridden
as ``suite.samples=4``, ``suite.only=[math500]``, ``suite.benchmarks.math500.files=/data/math500.jsonl``.
Writes ``<out>/eval/<suite>/``: summary.json (per benchmark and macro-averaged avg@n, pass@k, maj@k), table.md,
samples.jsonl (one row per completion) and config.json. ``--out`` defaults to the run directory, else ".".
Bad input (an unknown suite or benchmark, k > samples, a run directory without weights, a hub id offline) is one
line and exit code 2, before any model loads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pods.errors import ConfigError
from pods.numerics import pin


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pods-eval", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a model directory, a hub id, or a pods run directory")
    p.add_argument("overrides", nargs="*", help="suite.KEY=VALUE overrides")
    p.add_argument("--suite", default="pods", help="conf/suite/NAME.yaml (default: pods)")
    p.add_argument("--checkpoint", default=None, help="run directory: a file under checkpoints/ or 'latest' (default: final/)")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="generation engine (vllm: when installed)")
    p.add_argument("--out", type=Path, default=None, help="writes OUT/eval/<suite>/ (default: the run directory, else .)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-batch", type=int, default=64, help="sequences per generate call (hf)")
    return p.parse_intermixed_args(argv)


def prepare(args: argparse.Namespace):
    """Everything checked before a model loads: (suite, target, {benchmark: examples}, prompt)."""
    from pods.compose import CONF
    from pods.eval.benchmarks import compose_suite, load_benchmark, selected
    from pods.eval.weights import resolve

    suites = sorted(p.stem for p in (CONF / "suite").glob("*.yaml"))
    if args.suite not in suites:
        raise ConfigError(f"--suite: unknown suite '{args.suite}'; valid: {', '.join(suites)}")
    bad = [o for o in args.overrides if not o.lstrip("+~").startswith("suite.")]
    if bad:
        raise ConfigError(f"override '{bad[0]}': overrides are suite keys, e.g. suite.samples=4 or suite.only=[gsm8k]")
    suite = compose_suite(args.suite, args.overrides)
    if args.engine == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("--engine vllm: vllm is not installed (pip install '.[cpu]' or '.[gpu]'), or use --engine hf")
    target = resolve(args.model, args.checkpoint)
    run_prompt = (target.run_cfg or {}).get("dataset", {}).get("prompt_format")
    prompt = suite.prompt or run_prompt or "pods_instruct"
    data = {}
    for name in selected(suite):
        try:
            data[name] = load_benchmark(suite.benchmarks[name], prompt)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"benchmark '{name}': {e}") from None
    return suite, target, data, prompt


def main(argv: list[str] | None = None) -> int:
    pin()  # the CPU numerics, before anything loads torch (pods.numerics)
    args = parse_args(argv)
    try:
        suite, target, data, prompt = prepare(args)
    except ConfigError as e:
        print(f"pods-eval: {e}", file=sys.stderr)
        return 2
    from pods.eval.run import evaluate_suite

    out = (args.out or target.run_dir or Path(".")) / "eval" / suite.name
    start = time.time()
    summary = evaluate_suite(suite, target, data, prompt, out, args)
    summary["seconds"] = round(time.time() - start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print((out / "table.md").read_text())
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
