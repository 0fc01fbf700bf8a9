"""The tolerance table: every float gap a test allows, against the gaps measured under each ATen kernel ISA.

``make test-isa`` runs the tolerance-sensitive tests once per ISA with ``PODS_GAPS=<dir>/gaps-<isa>.jsonl``; each
``harness.within(measured, tol, what)`` call appends one row there. This script joins the files into one markdown
table (one line per test and check: the tolerance, the largest gap measured under each ISA, and the margin, i.e.
tolerance / largest gap) and flags any check whose gap reached its tolerance:

    python scripts/gap_table.py results/cpu/numerics/gaps-*.jsonl > results/cpu/numerics/tolerances.md

``--per-test`` prints the shorter table of docs/numerics.md instead: one line per test (its checks, tolerances, the
largest gap per ISA, the smallest margin over its checks).

Exit codes: 0 every gap below its tolerance; 1 some gap reached it; 2 bad input (a missing file, a line that is not
a gap row: one line naming the file and line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ISA_ORDER = ("DEFAULT", "AVX2", "AVX512")


def _isas(rows: list[dict]) -> list[str]:
    return sorted({r["isa"] for r in rows}, key=lambda i: ISA_ORDER.index(i) if i in ISA_ORDER else len(ISA_ORDER))


def _test(r: dict) -> tuple[str, str]:
    """(file, test function) of a row, parametrisation dropped."""
    file, _, test = r["test"].partition("::")
    return file.removeprefix("tests/"), test.split("[")[0]


FIELDS = {"test": str, "what": str, "measured": (int, float), "tol": (int, float), "isa": str}  # one harness.within row


class BadRow(ValueError):
    """A line of a gaps file that is not a gap row."""


def read_rows(paths: list[Path]) -> list[dict]:
    """Every gap row of ``paths``; ``BadRow`` naming the file and line of the first that is not JSON or lacks a field."""
    rows = []
    for path in paths:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadRow(f"{path}:{n}: not JSON ({e.msg}): not a gaps file written by make test-isa") from None
            bad = [k for k, t in FIELDS.items() if not isinstance(row, dict) or not isinstance(row.get(k), t)]
            if bad:
                raise BadRow(f"{path}:{n}: not a gap row (missing or mistyped: {', '.join(bad)}; a row has {', '.join(FIELDS)})")
            rows.append(row)
    if not rows:
        raise BadRow(f"no gap rows in {', '.join(map(str, paths))}")
    return rows


def table(rows: list[dict]) -> tuple[str, int]:
    """(markdown, number of checks at or over their tolerance). A check is one (test, what) pair; parametrised
    cases and repeated calls keep their largest gap per ISA."""
    worst: dict[tuple, dict[str, float]] = defaultdict(dict)
    tols: dict[tuple, float] = {}
    for r in rows:
        key = (*_test(r), r["what"])
        worst[key][r["isa"]] = max(worst[key].get(r["isa"], 0.0), r["measured"])
        tols[key] = r["tol"]
    isas = _isas(rows)
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


def per_test(rows: list[dict]) -> str:
    """One line per test: its checks, tolerances, the largest gap under each ISA ("skipped" where it did not run) and
    the smallest tolerance / gap over its checks ("exact": every gap was 0)."""
    by_test: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by_test[_test(r)].append(r)
    isas = _isas(rows)
    lines = [
        f"| test | checks | tolerances | largest gap measured ({' / '.join(isas)}) | smallest margin |",
        "|---|---|---|---|---|",
    ]
    for (file, test), rs in sorted(by_test.items()):
        tols = ", ".join(f"{t:g}" for t in sorted({r["tol"] for r in rs}))
        worst = [max((r["measured"] for r in rs if r["isa"] == i), default=None) for i in isas]
        cells = " / ".join("skipped" if w is None else f"{w:.1e}" for w in worst)
        margins = [r["tol"] / r["measured"] for r in rs if r["measured"] > 0]
        margin = f"{min(margins):.1f}x" if margins else "exact"
        lines.append(f"| `{file}::{test}` | {len({r['what'] for r in rs})} | {tols} | {cells} | {margin} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="gaps-<isa>.jsonl files written by make test-isa")
    ap.add_argument("--per-test", action="store_true", help="one line per test (the table in docs/numerics.md)")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    try:
        if missing:
            raise BadRow(f"no such file: {', '.join(missing)} (make test-isa writes them)")
        rows = read_rows(args.files)
    except BadRow as e:
        print(f"gap_table.py: error: {e}", file=sys.stderr)
        return 2
    text, over = table(rows)
    sys.stdout.write(per_test(rows) if args.per_test else text)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
