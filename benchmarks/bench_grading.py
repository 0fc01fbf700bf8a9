"""Accuracy and speed of each grader on the reference solutions of GSM8K test (1319) and the MATH subset (500).

    python benchmarks/bench_grading.py [--data ../shared/data] [--out results/bench/grading.csv] [--timeout 5]

For each grader and set: the gold solutions graded as completions against their own gold answer
(``accuracy``: should be 1.0) and the same solutions with the final answer changed to a wrong one
(``false_accept``: should be 0.0), both through pods.tasks.score_batch (worker processes, per-call time
limit). ``pool_s_per_1k`` = wall-clock seconds per 1000 gradings in the pool (default workers);
``inproc_s_per_1k`` = the same gradings in this process without the guard; ``load_avg`` = the machine's
1-minute load average when the row finished (timings on a shared machine compare only at equal load).
GSM8K solutions end in "#### x"; the boxed grader sees that line as "\\boxed{x}". A wrong answer =
gold + 1 for numbers, else the last digit bumped. Rewrites the CSV (one row per grader x set).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pods.tasks import GRADERS, score_batch  # noqa: E402
from pods.tasks.extract import canonical_number  # noqa: E402
from pods.tasks.gsm8k import gsm8k_gold  # noqa: E402
from pods.tasks.mathds import math_gold  # noqa: E402

NAMES = ["lenient", "math_verify", "boxed"]


def wrong_answer(gold: str) -> str:
    number = canonical_number(gold)
    if number is not None:
        return str(Decimal(number) + 1)
    digits = list(re.finditer(r"\d", gold))
    if not digits:
        return gold + "+1"
    i = digits[-1].start()
    return gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1 :]


def sets(data: Path, grader: str) -> dict[str, tuple[list[str], list[str], list[str]]]:
    """name -> (right completions, wrong completions, golds)."""
    gsm = [json.loads(line) for line in (data / "gsm8k" / "test.jsonl").open()]
    math = [json.loads(line) for line in (data / "math" / "test.jsonl").open()]
    fmt = "\\boxed{%s}" if grader == "boxed" else "#### %s"
    g_sol = [r["answer"][: r["answer"].rfind("####")] for r in gsm]
    g_gold = [gsm8k_gold(r["answer"]) for r in gsm]
    m_sol = [r["solution"] for r in math]
    m_gold = [math_gold(r) for r in math]
    return {
        "gsm8k_test": ([s + fmt % g for s, g in zip(g_sol, g_gold)], [s + fmt % wrong_answer(g) for s, g in zip(g_sol, g_gold)], g_gold),
        "math_subset": (m_sol, [s[: s.rfind("\\boxed")] + "\\boxed{%s}" % wrong_answer(g) for s, g in zip(m_sol, m_gold)], m_gold),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "grading.csv")
    p.add_argument("--timeout", type=float, default=5.0)
    args = p.parse_args()
    score_batch(["warm"], ["1"], "correctness", "lenient", timeout_s=args.timeout)  # start the workers off the clock
    rows = []
    for grader in NAMES:
        for name, (right, wrong, golds) in sets(args.data, grader).items():
            start = time.perf_counter()
            ok = score_batch(right, golds, "correctness", grader, timeout_s=args.timeout)
            bad = score_batch(wrong, golds, "correctness", grader, timeout_s=args.timeout)
            pooled = time.perf_counter() - start
            start = time.perf_counter()
            grade = GRADERS.get(grader)
            for c, g in zip(right + wrong, golds + golds):
                grade(c, g)
            inproc = time.perf_counter() - start
            n = len(golds)
            rows.append(
                {
                    "set": name,
                    "grader": grader,
                    "n": n,
                    "accuracy": round(sum(s.correct for s in ok) / n, 4),
                    "false_accept": round(sum(s.correct for s in bad) / n, 4),
                    "timeouts": sum(s.timed_out for s in ok + bad),
                    "errors": sum(bool(s.error) and not s.timed_out for s in ok + bad),
                    "pool_s_per_1k": round(pooled / (2 * n) * 1000, 3),
                    "inproc_s_per_1k": round(inproc / (2 * n) * 1000, 3),
                    "load_avg": round(os.getloadavg()[0], 1),  # other jobs on the machine slow every timing
                }
            )
            print(rows[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in rows[0]}
    print("\n" + "  ".join(k.ljust(w) for k, w in widths.items()))
    for r in rows:
        print("  ".join(str(r[k]).ljust(w) for k, w in widths.items()))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
