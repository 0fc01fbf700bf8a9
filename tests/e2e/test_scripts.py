"""``scripts/``: the user-facing scripts run as their commands (each once as a real process, its other cases in-process
as ``__main__``: ``support.doors``).

``scripts/compare_runs.py`` on hand-made run directories: B has A's accuracy at every step but its steps cost half
the seconds, so B reaches 99% of A's best 2x sooner by time and at the same step, and the band metric says 2x and 1x
per seed pair and pooled; a directory of two seeds is averaged; a path without runs is refused with one error line
(exit 2)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.doors import Ran, door

ROOT = Path(__file__).resolve().parents[2]
COMPARE = ROOT / "scripts" / "compare_runs.py"


def write_run(path: Path, accs: list[float], dt: float, n: int) -> Path:
    """8 train steps of ``dt`` seconds, an evaluation every 4 steps; config.json with GRPO n/n or PODS n->16."""
    rows = [
        {"kind": "train", "step": s, "train_time": s * dt, "zero_var_groups": 0.0, "t_generate": dt / 2, "t_update": dt / 2}
        for s in range(1, 9)
    ]
    rows += [{"kind": "eval", "step": 4 * i, "train_time": 4 * i * dt, "accuracy": a, "n_eval": 100} for i, a in enumerate(accs)]
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    alg = {"name": "grpo_pods", "n": n, "m": 16, "rule": "all" if n == 16 else "max_variance", "grad_accum": False}
    (path / "config.json").write_text(json.dumps({"algorithm": alg}))
    return path


def compare(*args, process: bool = False) -> subprocess.CompletedProcess | Ran:
    """``python scripts/compare_runs.py ARGS``: a real process, or in-process as ``__main__`` (``support.doors``)."""
    if not process:
        return door(COMPARE, list(args))
    return subprocess.run([sys.executable, str(COMPARE), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_compare_runs_prints_costs_curves_and_speedups(tmp_path):
    a = write_run(tmp_path / "grpo", [0.2, 0.5, 0.6], dt=1.0, n=16)
    for seed in (1, 2):  # the same curve twice: the mean is that curve
        write_run(tmp_path / "pods" / f"seed{seed}", [0.2, 0.5, 0.6], dt=0.5, n=64)
    p = compare(a, tmp_path / "pods", "--csv", tmp_path / "t.csv", process=True)
    assert p.returncode == 0, p.stderr
    assert "A: " in p.stdout and "(GRPO 16/16; 1 run): 8 steps, 1.000 s/step; accuracy 0.200 at start, best 0.600" in p.stdout
    assert "(PODS 64→16; 2 runs): 8 steps, 0.500 s/step" in p.stdout
    # target 0.594 between the evals at steps 4 (0.5) and 8 (0.6): step 7.76, i.e. 7.76 s for A and 3.88 s for B
    assert "B vs A by time, 99% of peak: to 0.594 (99% of A's best mean 0.600) A 8 s, B 4 s: speed-up 2.00x" in p.stdout
    assert "[budget-bound: A has not plateaued (best at its last evaluation in 1 of 1 seeds)]" in p.stdout  # A's best is its last
    # the band metric: levels 40-90% of the way from A's start 0.2 to its level 0.6; B is A at half the seconds
    assert "B vs A by time, band on accuracy 0.360-0.560" in p.stdout and "per seed pair 2.00x; pooled 2.00x" in p.stdout
    assert "B vs A by step, band on accuracy" in p.stdout and "pooled 1.00x (no interval below 3 seeds)" in p.stdout
    with (tmp_path / "t.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["time"]) for r in rows] == [0.0, 2.0, 4.0, 6.0, 8.0]  # the median gap between evaluations: B's 2 s
    assert rows[2]["B"] == "0.6" and rows[2]["A"] == "0.5" and rows[4]["B"] == ""  # B ended at 4 s: never extrapolated


@pytest.mark.parametrize("bad", ["missing", "empty"])
def test_compare_runs_refuses_a_path_without_runs(tmp_path, bad):
    a = write_run(tmp_path / "a", [0.2, 0.5], dt=1.0, n=16)
    (tmp_path / "empty").mkdir()
    p = compare(a, tmp_path / bad)
    assert p.returncode == 2 and p.stdout == ""
    assert (
        p.stderr.strip().splitlines()[-1]
        == f"compare_runs.py: error: B: no run at {tmp_path / bad} (a directory with metrics.jsonl, or one with run directories below it)"
    )


def test_sparse_rl_toy_report_summarises_runs_per_arm_and_seed(tmp_path):
    """``scripts/sparse_rl_toy.py report`` on hand-made runs: per run the last step, the first / last / best evaluation
    and the means over the train rows (the sparse arms' KV saving, the corrected arm's rejection); per arm the table's
    mean +- sd over seeds; copies of each run's metrics; without runs, one error line."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    for arm, seed, saving in (("dense", 0, None), ("sparse_rl", 0, 0.1), ("sparse_rl", 1, 0.3)):
        extra = {} if saving is None else {"kv_saving": saving, "sparse_rl_rejected_frac": 0.5 * saving}
        rows = [{"kind": "train", "step": s, "train_time": 2.0 * s, "t_generate": 0.5, **extra} for s in (1, 2)]
        rows += [{"kind": "eval", "step": s, "train_time": 2.0 * s, "accuracy": a} for s, a in ((0, 0.1), (1, 0.4 + seed / 10), (2, 0.3))]
        (runs / f"{arm}_s{seed}").mkdir(parents=True)
        (runs / f"{arm}_s{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sparse_rl_toy.py"), "report", "--runs", str(runs), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    with (out / "summary.csv").open() as f:
        rows = {(r["arm"], r["seed"]): r for r in csv.DictReader(f)}
    assert set(rows) == {("dense", "0"), ("sparse_rl", "0"), ("sparse_rl", "1")}
    got = rows[("sparse_rl", "1")]
    assert (got["steps"], got["acc_start"], got["acc_final"], got["acc_best"], got["s_per_step"]) == ("2", "0.1", "0.3", "0.5", "2.0")
    assert float(got["kv_saving"]) == pytest.approx(0.3) and rows[("dense", "0")]["kv_saving"] == ""
    assert "| Sparse-RL | 2 +- 0 | 0.100 -> 0.300 +- 0.000 | 0.450 | 20.0% | 10.000% |" in run.stdout
    assert (out / "sparse_rl_s1.metrics.jsonl").read_text() == (runs / "sparse_rl_s1" / "metrics.jsonl").read_text()
    empty = door(ROOT / "scripts" / "sparse_rl_toy.py", ["report", "--runs", tmp_path / "none", "--out", out])  # in-process
    assert empty.returncode == 2 and "no finished runs" in empty.stderr.strip().splitlines()[-1]


def test_gap_table_joins_the_isas_and_fails_when_a_gap_reaches_its_tolerance(tmp_path):
    """``scripts/gap_table.py`` on hand-written gap files: one line per (test, check) with its largest gap per ISA and
    the margin; ``--per-test`` one line per test; exit 1 once a measured gap reaches its tolerance."""
    script = ROOT / "scripts" / "gap_table.py"

    def gaps(isa: str, measured: list[float], tol: float = 1e-4) -> Path:
        path = tmp_path / f"gaps-{isa}.jsonl"
        rows = [
            {"test": f"tests/test_x.py::test_a[{i}]", "what": "w", "measured": m, "tol": tol, "isa": isa} for i, m in enumerate(measured)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    def table(*args, process: bool = False) -> subprocess.CompletedProcess | Ran:
        if not process:
            return door(script, list(args))  # in-process, as __main__ (support.doors)
        return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=60)

    ok = table(gaps("AVX2", [1e-6, 2e-6]), gaps("DEFAULT", [5e-6]), process=True)
    assert ok.returncode == 0, ok.stderr
    assert "| test_x.py | test_a | w | 1e-04 | 5.0e-06 | 2.0e-06 | 20x |" in ok.stdout  # DEFAULT before AVX2; the largest per ISA
    per = table("--per-test", tmp_path / "gaps-AVX2.jsonl")
    assert "| `test_x.py::test_a` | 1 | 0.0001 | 2.0e-06 | 50.0x |" in per.stdout
    over = table(gaps("AVX512", [1e-4]))
    assert over.returncode == 1
    assert table(tmp_path / "none.jsonl").returncode != 0


def test_compare_runs_says_one_best_per_side_and_no_speed_up_for_a_target_never_reached(tmp_path):
    """A peaks between the common grid's points (its evaluations at 0, 3, 6 s; B's at 0, 4, 8 s): the side's line used
    to print the grid's best (an interpolated 0.6xx) and the 99% line A's own (0.700); B never reaches 99% of it, which
    used to print "speed-up 0.00x"."""
    a = write_run(tmp_path / "a", [0.2, 0.7, 0.5], dt=0.75, n=16)
    b = write_run(tmp_path / "b", [0.1, 0.2, 0.3], dt=1.0, n=64)
    p = compare(a, b)
    assert p.returncode == 0, p.stderr
    assert "accuracy 0.200 at start, best 0.700, last 0.500" in p.stdout, p.stdout  # the grid said last 0.667 (at 3.5 s)
    assert "99% of A's best mean 0.700" in p.stdout and "0.00x" not in p.stdout
    assert "B never: no speed-up: B never reached it" in p.stdout and "no speed-up: the arm reached none of the 11 levels" in p.stdout


def test_compare_runs_warns_about_a_metrics_file_holding_two_runs(tmp_path):
    """A run started twice into one directory (before that was refused) appended a second setup row and its rows:
    compare_runs.py used to read the mixed file without a word."""
    a = write_run(tmp_path / "a", [0.2, 0.5, 0.6], dt=1.0, n=16)
    b = write_run(tmp_path / "b", [0.2, 0.5, 0.6], dt=0.5, n=64)
    text = (b / "metrics.jsonl").read_text()
    (b / "metrics.jsonl").write_text(
        json.dumps({"kind": "setup", "step": 0}) + "\n" + text + json.dumps({"kind": "setup", "step": 0}) + "\n" + text
    )
    p = compare(a, b)
    assert p.returncode == 0, p.stderr
    assert f"{b / 'metrics.jsonl'} holds the rows of 2 runs (2 setup rows)" in p.stderr, p.stderr
    assert "holds the rows of" not in compare(a, a).stderr
