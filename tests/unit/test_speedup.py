"""The band speed-up metric (``pods.results.speedup``) on hand-made curves: isotonic fit, crossings, levels, the
median over levels, per seed pair and pooled, the interval only from 3 seeds, and the budget-bound flag."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pods.results.curves import speedup
from pods.results.speedup import Band, band_line, band_point, band_speedup, budget_bound, budget_note, crossing, isotonic


def curve(xs, ys):
    return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)


def rising(scale: float, end: float = 100.0, top: float = 0.8, noise: list[float] | None = None, k: int = 11):
    """Accuracy rising linearly from 0.2 to ``top`` over ``end`` x-units (evaluations every end/(k-1)), time scaled."""
    xs = np.linspace(0.0, end, k)
    ys = 0.2 + (top - 0.2) * xs / end + (np.asarray(noise) if noise is not None else 0.0)
    return curve(xs * scale, ys)


def test_isotonic_pools_adjacent_violators():
    assert np.allclose(isotonic([0.1, 0.3, 0.2, 0.5]), [0.1, 0.25, 0.25, 0.5])
    assert np.allclose(isotonic([0.4, 0.3, 0.2]), [0.3, 0.3, 0.3])
    assert np.allclose(isotonic([0.1, 0.2, 0.3]), [0.1, 0.2, 0.3])


def test_crossing_interpolates_between_points_and_says_never():
    c = curve([0, 10, 20], [0.2, 0.4, 0.6])
    assert crossing(c, 0.5) == pytest.approx(15.0)
    assert crossing(c, 0.2) == 0.0
    assert crossing(c, 0.61) is None


def test_an_arm_twice_as_fast_is_2x_at_every_level_per_pair_and_pooled():
    base = [rising(1.0), rising(1.0)]
    arm = [rising(0.5, end=200.0, top=1.4), rising(0.5, end=200.0, top=1.4)]  # same slope per x-unit at half the time
    r = band_speedup(base, arm, Band(0.4, 0.9, 6))
    assert r["speedup"] == pytest.approx(2.0)
    assert r["pairs"] == pytest.approx([2.0, 2.0])
    assert r["lo"] is None and r["hi"] is None  # 2 seeds: no interval
    # levels: 40..90% of the way from the baseline's start 0.2 to its level 0.8
    assert np.allclose(r["levels"], [0.44, 0.50, 0.56, 0.62, 0.68, 0.74])


def test_levels_the_arm_never_reaches_count_zero_and_the_median_decides():
    base = [rising(1.0)]
    arm = [curve([0, 50, 100], [0.2, 0.5, 0.55])]  # reaches the low levels 2x sooner, never the high ones
    r = band_point(base, arm, Band(0.4, 0.9, 6))
    assert r["never"] == 4  # 0.56 .. 0.74
    assert r["speedup"] == pytest.approx(0.0)  # median of [2x, ~1.9x, 0, 0, 0, 0]


def test_one_noisy_last_evaluation_flips_the_99_percent_metric_but_not_the_band():
    """The issue's failure: a baseline that never plateaus, its best at its last evaluation; a +0.05 spike there
    moves the paper's target past the arm's peak, while the band metric barely moves."""
    noise = [0.0] * 10
    quiet, spiked = rising(1.0, noise=noise + [0.0]), rising(1.0, noise=noise + [0.05])
    arm = [rising(0.5, end=130.0, top=0.8 + 0.6 * 0.3)]  # 2x as fast, then stops at 65 x-units: peak 0.98
    arm = [curve(arm[0][0], np.minimum(arm[0][1], 0.81))]  # and plateaus at 0.81
    p_quiet, p_spiked = speedup([quiet], arm)["speedup"], speedup([spiked], arm)["speedup"]
    b_quiet, b_spiked = band_point([quiet], arm)["speedup"], band_point([spiked], arm)["speedup"]
    assert p_quiet > 1.5 and p_spiked == 0.0  # 0.99 x 0.85 = 0.84 is beyond the arm's plateau: "never"
    assert b_quiet == pytest.approx(2.0, rel=0.02) and b_spiked == pytest.approx(2.0, rel=0.1)
    assert budget_bound([quiet, spiked]) == 2
    assert "budget-bound" in budget_note([spiked], "GRPO-GA") and budget_note([curve([0, 1, 2], [0.2, 0.6, 0.5])], "X") == ""


def test_interval_from_three_seeds_brackets_the_pooled_value():
    rng = np.random.default_rng(1)
    base = [rising(1.0, noise=list(rng.normal(0, 0.02, 11))) for _ in range(3)]
    arm = [rising(0.5, noise=list(rng.normal(0, 0.02, 11))) for _ in range(3)]
    r = band_speedup(base, arm, n_boot=200)
    assert len(r["pairs"]) == 3 and all(1.5 < p < 2.6 for p in r["pairs"])
    assert r["lo"] <= r["speedup"] <= r["hi"] and r["lo"] > 1.4 and r["hi"] < 2.8


def test_band_line_prints_pairs_and_pooled():
    base, arm = [rising(1.0)], [rising(0.5)]
    line = band_line("PODS vs GRPO", "time", base, arm)
    assert re.search(r"band on sampled accuracy 0\.440-0\.740 .*per seed pair 2\.00x; pooled 2\.00x \(no interval below 3 seeds\)", line), (
        line
    )


@pytest.mark.parametrize("lo, hi, levels", [(0.9, 0.4, 11), (-0.1, 0.5, 11), (0.4, 0.9, 1)])
def test_a_bad_band_is_refused_in_one_line(lo, hi, levels):
    with pytest.raises(ValueError, match="a band needs 0 <= lo < hi <= 1"):
        Band(lo, hi, levels)


def write_run(path, accs, dt, probs=None):
    """8 train steps of ``dt`` s, an evaluation every 4 steps (accuracy, and answer_prob when given)."""
    import json

    rows = [
        {"kind": "train", "step": s, "train_time": s * dt, "zero_var_groups": 0.5, "t_generate": dt / 4, "t_update": dt / 2}
        for s in range(1, 9)
    ]
    for i, a in enumerate(accs):
        rows.append(
            {
                "kind": "eval",
                "step": 4 * i,
                "train_time": 4 * i * dt,
                "accuracy": a,
                "n_eval": 800,
                **({"answer_prob": probs[i]} if probs else {}),
            }
        )
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_per_step_summary_prints_band_on_both_curves_and_the_gpu_cost_model(tmp_path):
    """``pods.demo per-step-summarize`` on hand-made runs: PODS gains 0.3 per 4 steps, GRPO 0.15 (2x per step);
    the cost model puts both on the L40S clock (8.2 s vs 10.2 s per step): 2 x 8.2 / 10.2 = 1.61x."""
    from pods import demo

    for k in (1, 2, 3):
        write_run(tmp_path / "runs" / demo.PER_STEP[demo.GRPO] / f"seed{k}", [0.1, 0.25, 0.4], 0.2, [0.05, 0.15, 0.25])
        write_run(tmp_path / "runs" / demo.PER_STEP[demo.PODS] / f"seed{k}", [0.1, 0.4, 0.7], 0.4, [0.05, 0.25, 0.45])
    demo.main(["per-step-summarize", "--out", str(tmp_path)])
    text = (tmp_path / "summary.txt").read_text()
    by_step = re.search(r"PODS 64→16 vs GRPO 16/16 by step, band on sampled accuracy .*pooled (\S+)x \[95% (\S+), (\S+)\]", text)
    assert by_step and float(by_step.group(1)) == pytest.approx(2.0, rel=0.01), text
    assert "by step, band on answer_prob" in text and "by time, band on sampled accuracy" in text
    assert "GPU COST MODEL (not a measurement)" in text
    model = re.search(r"model, paper's L40S 8.2 s / 10.2 s per step: .*pooled (\S+)x", text)
    assert model and float(model.group(1)) == pytest.approx(2.0 * 8.2 / 10.2, rel=0.01), text
    assert (tmp_path / "accuracy_vs_time.csv").read_text().splitlines()[0].endswith("accuracy,answer_prob,n_eval")


def test_idle_clock_puts_the_step_curves_on_the_calibration_s_per_step(tmp_path):
    """PODS learns per step as GRPO-GA does; on the idle-calibrated clock (0.306 vs 0.573 s/step) it is 1.87x sooner."""
    from pods import demo
    from pods.results.runs import load_run

    for exp in ("ga", "pods"):
        write_run(tmp_path / exp, [0.1, 0.4, 0.6], 1.0)
    runs = {demo.GA: [load_run(tmp_path / "ga")], demo.PODS: [load_run(tmp_path / "pods")]}
    (line,) = demo.idle_clock(runs)
    assert "by idle-calibrated seconds (steps x idle s/step: a model)" in line
    assert float(re.search(r"pooled (\S+)x", line).group(1)) == pytest.approx(0.573 / 0.306, abs=0.01)
