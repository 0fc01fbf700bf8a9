"""D3S's outcome ablation: the arm files (they differ only in the algorithm section), the shipped re-blurred starting
model, the evaluation curve by tokens trained, and the summary's band metric, paired differences and registered
predictions on hand-made runs whose answer is known (an arm that learns per step exactly as GRPO does on half the
tokens: band 1x by steps, 2x by tokens)."""

from __future__ import annotations

import json

import numpy as np

from pods.results.d3s_outcome import ARMS, eval_curve, summarize
from pods.schema import Root
from support.config import compose


def test_the_arms_differ_only_in_the_algorithm_and_start_from_the_shipped_reblurred_model():
    from pods.tiny import ASSETS, asset_name, ensure_tiny

    cfgs = {arm: compose([f"experiment=d3s_outcome_{arm}_cpu"]) for arm in ARMS}
    base = {k: v for k, v in cfgs["grpo"].items() if k != "algorithm"}
    got = {}
    for arm, cfg in cfgs.items():
        assert {k: v for k, v in cfg.items() if k != "algorithm"} == base, arm
        a = Root.of(cfg).algorithm
        got[arm] = (a.rule, a.m, a.m_final, a.token_rule, a.token_keep, a.token_keep_final, a.loss_agg)
    assert got == {
        "grpo": ("all", 8, None, "all", None, None, "token_mean"),
        "cross": ("d3s_cross", 4, None, "all", None, None, "token_mean"),
        "full": ("d3s_cross", 4, 8, "d3s_top_k", 0.2, 0.6, "token_mean"),
        "intra": ("d3s_intra", 4, None, "all", None, None, "token_mean"),
    }
    spec = base["model"]["spec"]
    assert asset_name(spec["base"]) == "tiny-2595596e38ce" and spec["warm_start_label_smoothing"] > 0
    assert ensure_tiny(spec).parent == ASSETS  # shipped: no run builds it
    assert base["optim"]["max_grad_norm"] is None and base["train"]["max_steps"] >= 150


def _run(steps: int, tokens_per_step: int, acc: list[float], prob: list[float], every: int) -> list[dict]:
    rows = [{"kind": "setup", "step": 0}]
    evals = dict(zip(range(0, steps + 1, every), zip(acc, prob)))
    for step in range(steps + 1):
        if step:
            rows.append({"kind": "train", "step": step, "train_time": float(step), "tokens": 100, "tokens_trained": tokens_per_step,
                         "kept": 4, "train_accuracy": 0.5, "zero_var_groups": 0.25})  # fmt: skip
        if step in evals:
            a, p = evals[step]
            rows.append({"kind": "eval", "step": step, "train_time": float(step), "accuracy": a, "answer_prob": p})
    return rows


def test_eval_curve_counts_tokens_trained_up_to_each_evaluation():
    rows = _run(4, 30, [0.1, 0.2, 0.3], [0.1, 0.2, 0.3], every=2)
    assert eval_curve(rows, "step", "accuracy")[0].tolist() == [0, 2, 4]
    xs, ys = eval_curve(rows, "tokens", "answer_prob")
    assert xs.tolist() == [0, 60, 120] and ys.tolist() == [0.1, 0.2, 0.3]


def test_summary_band_paired_and_predictions_on_runs_with_a_known_answer(tmp_path):
    rise = list(np.linspace(0.2, 0.8, 7))
    for arm, tokens, shift in (("grpo", 200, 0.0), ("cross", 100, 0.0), ("full", 100, -0.1)):
        for seed in (1, 2, 3):
            d = tmp_path / "runs" / f"{arm}_s{seed}"
            d.mkdir(parents=True)
            (d / "config.json").write_text(json.dumps({"train": {"max_steps": 12}}))
            later = [rise[0]] + [y + shift for y in rise[1:]]
            rows = _run(12, tokens, later, later, every=2)
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pred = {p["prediction"][0]: p for p in summarize(tmp_path, [1, 2, 3], ARMS, n_boot=20)}
    bands = {(b["arm"], b["x"], b["y"]): b for b in json.loads((tmp_path / "bands.json").read_text())}
    assert bands["cross", "step", "accuracy"]["speedup"] == 1.0 and bands["cross", "step", "accuracy"]["pairs"] == [1.0] * 3
    assert abs(bands["cross", "tokens", "answer_prob"]["speedup"] - 2.0) < 1e-9
    assert bands["full", "step", "answer_prob"]["speedup"] < 1.0  # lower curve: later at every level
    assert pred["a"]["held"] and abs(pred["a"]["value"]["acc_test"] - 0.6) < 1e-9
    assert pred["b"]["held"] and pred["c"]["held"] and pred["d"]["held"] and pred["b"]["informative"]
    es = [p for p in json.loads((tmp_path / "predictions.json").read_text()) if p["prediction"].startswith("e:")]
    assert [round(p["value"], 4) for p in es] == [0.0, -0.1] and [p["held"] for p in es] == [True, False]
    paired = (tmp_path / "paired.csv").read_text().splitlines()
    assert len(paired) == 1 + 2 * 3 * 2 and (tmp_path / "accuracy.png").stat().st_size > 0
