"""pods.results on synthetic runs: hand-computed speed-ups, the bootstrap against brute-force enumeration, mean curves on
a common grid, the run reader, the CPU figure and the D3S report written from run directories."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter

import numpy as np
import pytest

from pods.results.curves import bootstrap_speedup, mean_curve, speedup
from pods.results.report import arm_summary, compare, speedup_report
from pods.results.runs import Run, load_run


def line(slope: float, end: float, cap: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    xs = np.linspace(0.0, end, 11)
    return xs, np.minimum(slope * xs, cap)


def test_speedup_hand_computed():
    base = [line(0.01, 100)] * 2  # peak 1.0 at 100 -> target 0.99 reached at 99
    arm = [line(0.02, 50)] * 3  # reaches 0.99 at 49.5
    s = speedup(base, arm)
    assert s["target"] == pytest.approx(0.99)
    assert s["t_base"] == pytest.approx(99.0) and s["t_arm"] == pytest.approx(49.5)
    assert s["speedup"] == pytest.approx(2.0)
    b = bootstrap_speedup(base, arm, n_boot=50)
    assert b["lo"] == pytest.approx(2.0) and b["hi"] == pytest.approx(2.0) and b["never"] == 0.0  # identical seeds: no spread


def test_arm_that_never_reaches_counts_as_zero():
    s = speedup([line(0.01, 100)], [line(0.01, 100, cap=0.5)])
    assert s["t_arm"] is None and s["speedup"] == 0.0
    assert bootstrap_speedup([line(0.01, 100)], [line(0.01, 100, cap=0.5)], n_boot=20)["never"] == 1.0


def test_bootstrap_matches_enumeration():
    """Two seeds per arm: every resample is one of 4 x 4 equally likely ordered pairs of index pairs."""
    base = [line(0.01, 100), line(0.0125, 100)]  # peaks 1.0 (at 100) and 1.0 (capped from 80)
    arm = [line(0.02, 50), line(0.015, 60, cap=0.8)]
    exact = Counter()
    for bi, ai in itertools.product(itertools.product(range(2), repeat=2), repeat=2):
        exact[round(speedup([base[i] for i in bi], [arm[i] for i in ai])["speedup"], 9)] += 1 / 16
    b = bootstrap_speedup(base, arm, n_boot=4000, seed=1)
    seen = Counter(round(float(v), 9) for v in b["samples"])
    assert set(seen) <= set(exact)
    for v, p in exact.items():
        assert seen[v] / 4000 == pytest.approx(p, abs=0.03)
    assert b["never"] == pytest.approx(exact.get(0.0, 0.0), abs=0.03)
    ordered = sorted(exact.items())
    cdf = np.cumsum([p for _, p in ordered])
    assert b["lo"] == ordered[int(np.searchsorted(cdf, 0.025 - 1e-9))][0]  # the exact 2.5% quantile
    assert b["hi"] == ordered[int(np.searchsorted(cdf, 0.975 - 1e-9))][0]


def write_run(path, accs, dt, n_eval=400, zero_var=0.25):
    rows = [{"kind": "setup", "step": 0}]
    for s in range(1, 9):
        rows.append(
            {"kind": "train", "step": s, "train_time": s * dt, "zero_var_groups": zero_var, "t_generate": dt / 4, "t_update": dt / 2}
        )
    rows += [{"kind": "eval", "step": 4 * i, "train_time": 4 * i * dt, "accuracy": a, "n_eval": n_eval} for i, a in enumerate(accs)]
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_run_compare_by_time_and_step(tmp_path):
    """Same accuracy per step, but the arm's steps cost half: 2x by time, 1x by step."""
    base = load_run(write_run(tmp_path / "b", [0.2, 0.5, 0.6], dt=1.0))
    arm = load_run(write_run(tmp_path / "a", [0.2, 0.5, 0.6], dt=0.5, zero_var=0.0))
    assert base.costs["steps"] == 8 and base.costs["s_per_step"] == pytest.approx(1.0) and base.costs["zero_var"] == pytest.approx(0.25)
    assert arm.curve("time")[0].tolist() == [0.0, 2.0, 4.0] and arm.curve("step")[0].tolist() == [0.0, 4.0, 8.0]
    runs = {"GRPO": [base], "PODS": [arm]}
    by_time, by_step = compare(runs, "GRPO", "PODS", "time", n_boot=20), compare(runs, "GRPO", "PODS", "step", n_boot=20)
    # target 0.594 on the segment 0.5 -> 0.6 over steps 4 -> 8: step 4 + 4 * 0.94 = 7.76 (grid 0.02 steps)
    assert by_step["t_base"] == pytest.approx(7.76, abs=0.02) and by_step["speedup"] == pytest.approx(1.0)
    assert by_time["t_base"] == pytest.approx(7.76, abs=0.02) and by_time["t_arm"] == pytest.approx(3.88, abs=0.01)
    assert by_time["speedup"] == pytest.approx(2.0, rel=0.01)
    s = arm_summary([base])
    assert s["start"] == pytest.approx(0.2) and s["peak"] == pytest.approx(0.6)
    assert s["peak_ci"] == pytest.approx(1.96 * np.sqrt(0.6 * 0.4 / 400))  # one seed: binomial SE over eval samples
    text = "\n".join(speedup_report(runs, [("GRPO", "PODS")], n_boot=20))
    assert "speed-up 2.0" in text and "speed-up 1.00x" in text


def test_summary_over_seeds_uses_seed_spread():
    runs = [
        Run(d, [{"step": s, "train_time": float(s), "accuracy": a, "n_eval": 100} for s, a in enumerate(accs)])
        for d, accs in (("a", (0.2, 0.6)), ("b", (0.4, 0.8)))
    ]
    s = arm_summary(runs)
    assert s["start"] == pytest.approx(0.3) and s["peak"] == pytest.approx(0.7)
    assert s["start_ci"] == pytest.approx(1.96 * np.std([0.2, 0.4], ddof=1) / np.sqrt(2))


def test_cpu_figure_redraws_from_seeded_runs(tmp_path):
    """`make figure-cpu` (pods.demo summarize): every arm's seed directories -> figure, CSV, summary with both comparisons."""
    from pods import demo

    for i, exp in enumerate(demo.SEEDED.values()):
        for k in (1, 2):
            write_run(tmp_path / "runs" / exp / f"seed{k}", [0.2, 0.4 + 0.05 * k, 0.5 + 0.1 * i], dt=1.0 + i)
    demo.main(["summarize", "--out", str(tmp_path)])
    summary = (tmp_path / "summary.txt").read_text()
    for label in demo.SEEDED:  # one table row per arm, with its two seeds
        assert re.search(rf"^{re.escape(label)}\s+2\s", summary, re.M), summary
    for baseline, arm in demo.COMPARISONS:
        assert f"{arm} vs {baseline} by time" in summary and f"{arm} vs {baseline} by step" in summary
    assert len((tmp_path / "accuracy_vs_time.csv").read_text().splitlines()) == 1 + 3 * 2 * 3
    assert (tmp_path / "accuracy_vs_time.png").stat().st_size > 10_000


def test_mean_curve_runs_to_the_median_end_over_the_runs_that_reach_each_point():
    """Seeds with one step budget end at different seconds under a changing load: three runs ending at 10, 20, 30 s."""
    runs = [
        (np.array([0.0, 10.0]), np.array([0.0, 1.0])),
        (np.array([0.0, 20.0]), np.array([0.0, 1.0])),
        (np.array([0.0, 30.0]), np.array([0.0, 3.0])),
    ]
    mc = mean_curve(runs)
    grid, mean = mc.grid, mc.mean
    assert grid[-1] == 20.0  # reached by 2 of 3 runs
    assert mean[np.searchsorted(grid, 10.0)] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert mean[-1] == pytest.approx((1.0 + 2.0) / 2)  # the run that ended at 10 s no longer counts


def test_mean_curves_interpolate_runs_onto_a_common_grid():
    """The figures' tables: two runs on the grid 0, 5, 20 s; a run counts only inside its own span."""
    from pods.results.curves import mean_curves
    from pods.results.report import table

    runs = {"s1": [(0, 0.0), (10, 1.0)], "s2": [(0, 0.2), (4, 0.4), (20, 0.4)]}
    curves = {"A": [(np.array([t for t, _ in pts], dtype=float), np.array([y for _, y in pts])) for pts in runs.values()]}
    got = {c["time"]: c for c in table(mean_curves(curves, np.array([0.0, 5.0, 20.0])))}
    assert got[0]["mean"] == pytest.approx(0.1) and got[0]["runs"] == 2
    assert got[5]["mean"] == pytest.approx((0.5 + 0.4) / 2)  # s1 interpolated at 5 s
    assert got[20]["runs"] == 1 and got[20]["mean"] == pytest.approx(0.4) and got[20]["se"] == 0.0  # s1 ended at 10 s: never extrapolated
    assert got[0]["hi"] - got[0]["mean"] == pytest.approx(1.96 * 0.1)  # std(ddof=1) 0.1414 / sqrt(2) = 0.1


def test_default_grid_is_spaced_by_the_median_gap_and_a_run_never_counts_before_its_first_point():
    from pods.results.curves import mean_curves

    late = (np.array([10.0, 20.0, 30.0]), np.array([0.5, 0.6, 0.7]))  # first evaluated at 10 s
    early = (np.array([0.0, 10.0, 20.0, 30.0]), np.array([0.1, 0.2, 0.3, 0.4]))
    mc = mean_curves({"A": [late, early]})["A"]
    assert mc.grid.tolist() == [0.0, 10.0, 20.0, 30.0]  # median gap 10 s, to the latest point
    assert mc.runs.tolist() == [1, 2, 2, 2] and mc.mean[0] == pytest.approx(0.1) and mc.mean[1] == pytest.approx(0.35)


def write_config(run_dir, **algorithm):
    (run_dir / "config.json").write_text(json.dumps({"algorithm": algorithm}))


def test_find_runs_follows_the_figures_list_else_every_run_below(tmp_path):
    from pods.results.runs import LABELS, find_runs, group, record

    for name, n in (("b", 16), ("a", 64)):
        write_config(write_run(tmp_path / "store" / name, [0.2, 0.4], dt=1.0), name="grpo_pods", rule="max_variance", n=n, m=16)
    (tmp_path / "store" / "unfinished").mkdir()  # launched, nothing written yet
    assert [d.name for d in find_runs(tmp_path / "store")] == ["a", "b"]  # sorted, only runs with both files
    for name in ("b", "unfinished"):
        record(tmp_path / "fig", ["exp", f"run={name}"], tmp_path / "store" / name)
    assert [d.name for d in find_runs(tmp_path / "fig")] == ["b"]
    runs = [load_run(d) for d in find_runs(tmp_path / "store")]
    assert list(group(runs, LABELS.get("arm"))) == ["PODS 64→16", "GRPO 16/16"]  # n = m: every rollout kept
    assert runs[0].config["algorithm"]["n"] == 64 and len(runs[0].evals) == 2 and len(runs[0].train) == 8


def test_d3s_report_from_run_directories(tmp_path):
    """Two arms x two seeds with hand-picked token counts and accuracies: summary.csv's means and the three curve
    tables on their grids (5 s, 25 steps, 10 steps)."""
    from pods.results.d3s import report

    algs = {"d3s": dict(name="d3s", rule="d3s_intra", n=16, m=4, m_final=8), "grpo": dict(name="grpo", rule="all", n=16, m=16)}
    for arm, a in algs.items():
        for k, end_acc in ((1, 0.5), (2, 0.7)):
            d = tmp_path / "runs" / f"{arm}_{k}"
            d.mkdir(parents=True)
            train = [{"kind": "train", "step": s, "train_time": 1.0 * s, "grad_norm": float(k), "kept": 8, "tokens": 100, "tokens_trained": 25}
                     for s in range(1, 51)]  # fmt: skip
            evals = [{"kind": "eval", "step": s, "train_time": 1.0 * s, "accuracy": acc} for s, acc in ((0, 0.1), (25, 0.3), (50, end_acc))]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train + evals))
            write_config(d, **a)
    rows = {r["arm"]: r for r in report(tmp_path / "runs", tmp_path / "out")}
    assert set(rows) == {"D3S-I 16→4..8", "GRPO 16/16"}
    r = rows["D3S-I 16→4..8"]
    assert r["runs"] == 2 and r["steps"] == 50 and r["acc_start"] == pytest.approx(0.1) and r["acc_end"] == pytest.approx(0.6)
    assert r["acc_end_se"] == pytest.approx(np.std([0.5, 0.7], ddof=1) / np.sqrt(2)) and r["grad_norm_mean"] == pytest.approx(1.5)
    assert r["tokens_generated"] == 5000 and r["tokens_trained_frac"] == pytest.approx(0.25) and r["entropy_kept"] is None
    import csv

    by_step = list(csv.DictReader((tmp_path / "out" / "accuracy_vs_step.csv").open()))
    assert [float(c["time"]) for c in by_step if c["label"] == "GRPO 16/16"] == [0.0, 25.0, 50.0]
    assert float(by_step[-1]["mean"]) == pytest.approx(0.6) and by_step[-1]["runs"] == "2"
    grads = list(csv.DictReader((tmp_path / "out" / "grad_norm_vs_step.csv").open()))
    assert [float(c["time"]) for c in grads][:5] == [10.0, 20.0, 30.0, 40.0, 50.0]  # train rows start at step 1: no point at 0
    assert len((tmp_path / "out" / "accuracy_vs_time.csv").read_text().splitlines()) == 1 + 2 * 11  # 0..50 s every 5 s
    for name in ("accuracy_vs_time", "accuracy_vs_step", "grad_norm_vs_step"):
        assert (tmp_path / "out" / f"{name}.png").stat().st_size > 10_000
