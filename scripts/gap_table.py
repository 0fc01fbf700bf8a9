"""The tolerance table: every float gap a test allows, against the gaps measured under each ATen kernel ISA.

``make test-isa`` runs the tolerance-sensitive tests once per ISA with ``PODS_GAPS=<dir>/gaps-<isa>.jsonl``; each
``harness.within(measured, tol, what)`` call appends one row there. This script joins the files into one markdown
table (one line per test and check: the tolerance, the largest gap measured under each ISA, and the margin, i.e.
tolerance / largest gap) and flags any check whose gap reached its tolerance:

    python scripts/gap_table.py results/cpu/numerics/gaps-*.jsonl > results/cpu/numerics/tolerances.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def read_rows(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def table(rows: list[dict]) -> tuple[str, int]:
    """(markdown, number of checks at or over their tolerance). A check is one (test, what) pair; parametrised
    cases and repeated calls keep their largest gap per ISA."""
    worst: dict[tuple, dict[str, float]] = defaultdict(dict)
    tols: dict[tuple, float] = {}
    for r in rows:
        key = (r["test"].split("::", 1)[0].removeprefix("tests/"), r["test"].split("::", 1)[-1].split("[")[0], r["what"])
        worst[key][r["isa"]] = max(worst[key].get(r["isa"], 0.0), r["measured"])
        tols[key] = r["tol"]
    isas = sorted(
        {r["isa"] for r in rows}, key=lambda i: ["DEFAULT", "AVX2", "AVX512"].index(i) if i in ("DEFAULT", "AVX2", "AVX512") else 9
    )
    head = ["file", "test", "check", "tolerance", *[f"measured {i}" for i in isas], "margin"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    over = 0
    for key in sorted(worst):
        gaps = worst[key]
        top = max(gaps.values())
        over += top >= tols[key]
        margin = (f"{tols[key] / top:.0f}x" if tols[key] / top >= 10 else f"{tols[key] / top:.1f}x") if top > 0 else "exact"
        cells = [f"{gaps[i]:.1e}" if i in gaps else "-" for i in isas]
        lines.append("| " + " | ".join([*key, f"{tols[key]:.0e}", *cells, margin]) + " |")
    return "\n".join(lines) + "\n", over


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="gaps-<isa>.jsonl files written by make test-isa")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        sys.exit(f"gap_table: no such file: {', '.join(missing)} (make test-isa writes them)")
    text, over = table(read_rows(args.files))
    sys.stdout.write(text)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
