"""Grade a jsonl file of completions offline: ``pods-grade`` / ``python -m pods.grade``.

    pods-grade --task gsm8k --grader lenient --input in.jsonl --output out.jsonl [--recipe pods_release]
               [--gold-from-solution] [--timeout 5] [--workers 2]

Each input row needs ``completion`` and ``answer`` (the gold answer, or with ``--gold-from-solution`` the
full reference solution: GSM8K "#### x" or MATH "\\boxed{x}"). Output rows are the input rows plus
``correct``, ``extracted``, ``error`` (null, or why the row scored 0: a timeout, a crash) and, with
``--recipe``, ``reward`` and ``reward_terms``. Rows stream through in batches, each grading call under
the time limit of pods.tasks.score_batch; a malformed row is reported with its line number and skipped.
The output is written whole or not at all (a temporary file beside it, renamed at the end); it may not be the input.
Exit codes: 0 graded; 2 bad arguments (one line), or no row of the input could be graded (nothing is written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from pods.errors import ConfigError, need
from pods.files import atomic, writable
from pods.tasks import GRADERS, RECIPES, score_batch
from pods.tasks.extract import last_boxed
from pods.tasks.gsm8k import gsm8k_gold

GOLD_FROM_SOLUTION = {"gsm8k": gsm8k_gold, "math": last_boxed}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="pods-grade",
        description=__doc__.split("\n\n")[0],
        epilog="exit codes: 0 graded; 2 bad arguments (one line), or no row of the input could be graded (nothing written)",
    )
    p.add_argument("--task", required=True, choices=sorted(GOLD_FROM_SOLUTION), help="how to read gold answers out of solutions")
    p.add_argument("--grader", default="lenient", choices=GRADERS.names(), help="correctness grader (default: lenient)")
    p.add_argument("--recipe", default=None, choices=RECIPES.names(), help="also compute this reward recipe")
    p.add_argument("--input", required=True, type=Path, help="jsonl with 'completion' and 'answer' per row")
    p.add_argument("--output", required=True, type=Path, help="jsonl written with the grading results")
    p.add_argument("--gold-from-solution", action="store_true", help="'answer' holds a full reference solution")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds allowed per grading call (default 5)")
    p.add_argument("--workers", type=int, default=None, help="grading worker processes (default: min(2, cores))")
    p.add_argument("--batch-size", type=int, default=512, help="rows graded per batch")
    args = p.parse_args(argv)
    need(args.input.is_file(), f"--input: file not found: {args.input}")
    need(args.timeout > 0 and args.batch_size > 0, "--timeout and --batch-size must be positive")
    same = args.output.exists() and os.path.samefile(args.input, args.output)
    need(not same, f"--output {args.output} is the input file: grading would overwrite what it reads; name another file")
    writable(args.output, "--output")
    return args


def read_row(line: str, args: argparse.Namespace) -> tuple[dict | None, str | None, str]:
    """(row, gold, problem): problem is "" for a good row, else why it is skipped."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return None, None, f"invalid JSON ({e.msg} at column {e.colno})"
    if not isinstance(row, dict):
        return None, None, f"expected a JSON object, got {type(row).__name__}"
    completion, answer = row.get("completion"), row.get("answer")
    if not isinstance(completion, str):
        return None, None, "missing or non-string 'completion'"
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        return None, None, "missing or empty 'answer'"
    gold = GOLD_FROM_SOLUTION[args.task](answer) if args.gold_from_solution else answer.strip()
    if not gold:
        return None, None, "no gold answer found in the solution (" + ("'####'" if args.task == "gsm8k" else "closed \\boxed{}") + ")"
    return row, gold, ""


def main(argv: list[str] | None = None) -> int:
    try:
        return grade(parse_args(argv))
    except ConfigError as e:
        print(f"pods-grade: error: {e}", file=sys.stderr)
        return 2


def grade(args: argparse.Namespace) -> int:
    from pods.progress import bar as progress_bar

    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.input.open("rb") as f:
        total = sum(1 for _ in f)
    stats = {"rows": 0, "correct": 0, "skipped": 0, "timeouts": 0, "errors": 0, "reward": 0.0}
    start = time.time()
    with (
        args.input.open(encoding="utf-8", errors="replace") as fin,
        atomic(args.output, "w", encoding="utf-8") as fout,
        progress_bar(total=total, unit="row", file=sys.stderr) as bar,
    ):
        batch: list[tuple[dict, str]] = []

        def flush() -> None:
            scores = score_batch(
                [r["completion"] for r, _ in batch],
                [g for _, g in batch],
                args.recipe or "correctness",
                args.grader,
                timeout_s=args.timeout,
                workers=args.workers,
            )
            for (row, gold), s in zip(batch, scores):
                out = {**row, "correct": s.correct, "extracted": s.extracted, "error": s.error}
                if args.gold_from_solution:
                    out["gold"] = gold
                if args.recipe:
                    out["reward"], out["reward_terms"] = s.reward, s.terms
                fout.write(json.dumps(out, ensure_ascii=False) + "\n")
                stats["rows"] += 1
                stats["correct"] += s.correct
                stats["timeouts"] += s.timed_out
                stats["errors"] += s.error is not None and not s.timed_out
                stats["reward"] += s.reward
            bar.update(len(batch))
            batch.clear()

        for lineno, line in enumerate(fin, 1):
            if not line.strip():
                bar.update(1)
                continue
            row, gold, problem = read_row(line, args)
            if problem:
                bar.write(f"{args.input}:{lineno}: malformed row skipped: {problem}", file=sys.stderr)
                stats["skipped"] += 1
                bar.update(1)
                continue
            batch.append((row, gold))
            if len(batch) >= args.batch_size:
                flush()
        if batch:
            flush()
        if not stats["rows"]:  # raised inside the with: the output is not written
            why = f"all {stats['skipped']} rows are malformed (each named above)" if stats["skipped"] else "it holds no row"
            raise ConfigError(f"nothing to grade in {args.input}: {why}; {args.output} not written")
    print(summary(stats, args, time.time() - start))
    return 0


def summary(stats: dict, args: argparse.Namespace, seconds: float) -> str:
    n = stats["rows"]
    acc = stats["correct"] / n if n else 0.0
    lines = [
        f"task={args.task} grader={args.grader}" + (f" recipe={args.recipe}" if args.recipe else ""),
        f"graded {n} rows, skipped {stats['skipped']} malformed",
        f"accuracy {acc:.4f} ({stats['correct']}/{n})",
        f"timeouts {stats['timeouts']}, errors {stats['errors']}",
    ]
    if args.recipe:
        lines.append(f"mean reward {stats['reward'] / n if n else 0.0:.4f}")
    lines.append(f"{seconds:.1f} s -> {args.output}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
