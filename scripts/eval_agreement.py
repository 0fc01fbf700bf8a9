"""Agreement of a pods grader with the PODS authors' own correctness labels, per evaluation set.

The authors' repository (github.com/YixuanEvenXu/pods) releases, per training run, the offline evaluation of every
checkpoint: for GSM8K, MATH-500 and AMC23, the first few evaluated examples with the model's completion, the gold
answer and ``correct`` as their grader decided. This script grades the same (completion, gold) pairs with a pods grader
and counts how often the verdicts agree. Only the numbers are written (their data stays in their repository):

    python scripts/eval_agreement.py --authors-repo /path/to/pods-authors [--grader lenient] [--out results/grader_agreement]

``--authors-repo`` is a checkout (with ``results/*.json``) or a bare git directory (read with ``git show HEAD:...``).
Writes ``<out>/<grader>.json`` and ``<out>/<grader>.md`` (each whole or not at all); ``--show N`` prints N
disagreements per set. A missing or empty repository, one without result files, an unknown grader or an ``--out``
that cannot be written is refused in one line (exit 2) before anything is graded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pods.errors import ConfigError, need  # noqa: E402
from pods.files import atomic, writable  # noqa: E402


def result_files(repo: Path) -> dict[str, str]:
    """{file name: JSON text} of the authors' per-run result files (checkout or bare git directory); ``ConfigError``
    when ``repo`` is neither or holds none."""
    if (repo / "results").is_dir():
        files = {p.name: p.read_text() for p in sorted((repo / "results").glob("*-Run*.json"))}
        need(files, f"--authors-repo: no results/*-Run*.json in {repo}")
        return files
    names = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "--name-only", "HEAD", "results/"], capture_output=True, text=True)
    need(
        names.returncode == 0,
        f"--authors-repo: {repo} is neither a checkout with results/ nor a git directory (git: {(names.stderr.strip().splitlines() or ['failed'])[-1]})",
    )
    out = {}
    for name in names.stdout.split():
        if name.endswith(".json") and "-Run" in name:
            out[Path(name).name] = subprocess.run(
                ["git", "--git-dir", str(repo), "show", f"HEAD:{name}"], capture_output=True, text=True, check=True
            ).stdout
    need(out, f"--authors-repo: no results/*-Run*.json at HEAD of {repo}")
    return out


def labelled_examples(files: dict[str, str]) -> dict[str, list[tuple[str, str, bool]]]:
    """{eval set: [(completion, gold, the authors' verdict)]} over every run and checkpoint."""
    sets: dict[str, list] = defaultdict(list)
    for text in files.values():
        for per_set in json.loads(text).values():
            for name, block in per_set.items():
                sets[name] += [(e["completion"], str(e["answer"]), bool(e["correct"])) for e in block.get("examples", [])]
    return dict(sets)


def agreement(grade, rows: list[tuple[str, str, bool]]) -> tuple[dict, list]:
    counts = {"examples": len(rows), "agree": 0, "both_right": 0, "both_wrong": 0, "only_pods_right": 0, "only_authors_right": 0}
    disagreements = []
    for completion, gold, theirs in rows:
        ours = bool(grade(completion, gold)[0])
        counts["agree"] += ours == theirs
        key = {
            (True, True): "both_right",
            (False, False): "both_wrong",
            (True, False): "only_pods_right",
            (False, True): "only_authors_right",
        }
        counts[key[(ours, theirs)]] += 1
        if ours != theirs:
            disagreements.append((completion, gold, theirs, ours))
    counts["agreement"] = counts["agree"] / counts["examples"] if counts["examples"] else None
    return counts, disagreements


def table(grader: str, stats: dict) -> str:
    lines = [f"Agreement of `{grader}` with the PODS authors' released correctness labels", ""]
    lines += [
        "| eval set | examples | agreement | both right | both wrong | only pods right | only authors right |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in stats.items():
        lines.append(
            f"| {name} | {c['examples']} | {c['agreement']:.4f} | {c['both_right']} | {c['both_wrong']} | {c['only_pods_right']} | {c['only_authors_right']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--authors-repo", type=Path, required=True)
    p.add_argument("--grader", default="lenient")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "grader_agreement")
    p.add_argument("--show", type=int, default=0, help="print this many disagreements per eval set")
    args = p.parse_args(argv)
    from pods.tasks import GRADERS

    try:
        need(args.authors_repo.exists(), f"--authors-repo: {args.authors_repo} does not exist")
        need(args.grader in GRADERS.names(), f"--grader: unknown grader '{args.grader}' (one of {', '.join(GRADERS.names())})")
        writable(args.out, "--out", directory=True)
        grade = GRADERS.get(args.grader)
        sets = labelled_examples(result_files(args.authors_repo))
    except ConfigError as e:
        print(f"eval_agreement.py: error: {e}", file=sys.stderr)
        return 2
    stats = {}
    for name in sorted(sets):
        stats[name], disagreements = agreement(grade, sets[name])
        for completion, gold, theirs, ours in disagreements[: args.show]:
            print(f"--- {name}: gold {gold!r}, authors {theirs}, pods {ours}\n{completion[-400:]}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic(args.out / f"{args.grader}.json") as f:
        f.write(json.dumps({"grader": args.grader, "sets": stats}, indent=2) + "\n")
    with atomic(args.out / f"{args.grader}.md") as f:
        f.write(table(args.grader, stats))
    print(table(args.grader, stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
