"""``python -m pods.grade``: streams a jsonl, skips malformed rows by line number, exit codes. The first test runs it
as a real process (the command's one); the others in-process through ``pods.grade.main(argv)`` (``support.doors``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.doors import Ran, door

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    {"completion": "<think>\n9*2\n</think>\n<answer>\n18\n</answer>", "answer": "18"},
    {"completion": "so the answer is \\boxed{\\frac{1}{2}}", "answer": "0.5"},
    "this line is not JSON",
    {"completion": "I think 17", "answer": "She sells 9 eggs... 9 * 2 = 18\n#### 18", "id": 7},
    {"completion": 5, "answer": "1"},
    {"completion": "$9^{9^{9^{9}}}$ and \\boxed{" + "(" * 5000 + "}", "answer": 12},
]


def _run(*args: str, rows=ROWS, tmp_path: Path, process: bool = False) -> subprocess.CompletedProcess | Ran:
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    if not process:
        return door("pods.grade", list(args))
    return subprocess.run([sys.executable, "-m", "pods.grade", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_cli_grades_reports_malformed_rows_and_summarises(tmp_path):
    out = tmp_path / "out" / "graded.jsonl"
    rows = ROWS[:3] + ROWS[4:]  # a gold answer per row
    proc = _run(
        "--task",
        "gsm8k",
        "--grader",
        "math_verify",
        "--recipe",
        "pods_release",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(out),
        "--timeout",
        "5",
        rows=rows,
        tmp_path=tmp_path,
        process=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "in.jsonl:3: malformed row skipped: invalid JSON" in proc.stderr
    assert "in.jsonl:4: malformed row skipped: missing or non-string 'completion'" in proc.stderr
    graded = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["correct"] for g in graded] == [True, True, False]
    assert graded[0]["extracted"] == "18" and graded[0]["reward"] == 1.0 and graded[0]["error"] is None
    assert graded[2]["answer"] == 12 and graded[2]["reward"] == 0.0  # the adversarial row: scored, not crashed
    assert "graded 3 rows, skipped 2 malformed" in proc.stdout and "accuracy 0.6667 (2/3)" in proc.stdout
    assert "timeouts 0" in proc.stdout


def test_cli_gold_from_solution(tmp_path):
    out = tmp_path / "graded.jsonl"
    proc = _run(
        "--task",
        "gsm8k",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(out),
        "--gold-from-solution",
        rows=[ROWS[3], {"completion": "18", "answer": "no final answer marker"}],
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "in.jsonl:2: malformed row skipped: no gold answer found in the solution ('####')" in proc.stderr
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["gold"] == "18" and row["correct"] is False and row["extracted"] == "17" and "reward" not in row


def test_cli_bad_arguments_exit_2(tmp_path):
    missing = _run("--task", "gsm8k", "--input", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "o.jsonl"), tmp_path=tmp_path)
    assert missing.returncode == 2 and "--input: file not found" in missing.stderr
    unknown = _run(
        "--task",
        "gsm8k",
        "--grader",
        "nope",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(tmp_path / "o.jsonl"),
        tmp_path=tmp_path,
    )
    assert unknown.returncode == 2 and "invalid choice: 'nope'" in unknown.stderr
