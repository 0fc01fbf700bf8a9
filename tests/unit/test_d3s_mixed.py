"""The mixed-difficulty D3S ablation's pieces: ``train.log_strata`` (default off, validated), ``pods.d3s.strata`` on a
hand case, the five arm files (they differ only in the algorithm section, one normaliser and no clipping for all), the
tiny model's ``base`` key, and the summary's window curve, first crossing, registered predictions and the follow-up's
reported rows (GRPO learned or not; the paired on-policy difference to GRPO)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pods.d3s import strata
from pods.results.d3s_mixed import ARMS, first_reach, predictions, reported, window
from pods.schema import ConfigError, Root, Train
from support.config import compose


def test_log_strata_is_off_by_default_and_validated():
    assert Train.of({}).log_strata is False
    with pytest.raises(ConfigError, match="log_strata"):
        Train.of({"log_strata": "sometimes"})


def test_strata_counts_groups_zero_variance_kept_and_reward_per_prompt_length():
    prompts = [[1] * 22, [1] * 34, [1] * 22]  # two 2-term prompts and one 5-term prompt (toy_sum's lengths)
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    kept = [2, 2, 0]  # global group indices of the trained rows (rank 0, G = 3)
    assert strata(prompts, rewards, kept) == {"22": [2, 1, 3, 5.0], "34": [1, 1, 0, 0.0]}
    assert strata(prompts, rewards, [3, 4, 9], rank=1) == {
        "22": [2, 1, 1, 5.0],
        "34": [1, 1, 1, 0.0],
    }  # rank 1: groups 3..5; 9 is not its own


def test_the_five_arms_differ_only_in_the_algorithm_with_one_normaliser_and_no_clipping():
    cfgs = {arm: compose([f"experiment=d3s_mixed_{arm}_cpu"]) for arm in ARMS}
    base = {k: v for k, v in cfgs["grpo"].items() if k != "algorithm"}
    got = {}
    for arm, cfg in cfgs.items():
        assert {k: v for k, v in cfg.items() if k != "algorithm"} == base, arm
        a = Root.of(cfg).algorithm
        assert (a.n, a.loss_agg, a.advantage_scope) == (8, "token_mean", "group") and cfg["optim"]["max_grad_norm"] is None
        got[arm] = (a.rule, a.m, a.m_final, a.token_rule, a.token_keep, a.token_keep_final)
    assert got == {
        "grpo": ("all", 8, None, "all", None, None),
        "intra": ("d3s_intra", 4, None, "all", None, None),
        "cross": ("d3s_cross", 4, None, "all", None, None),
        "tokens": ("d3s_cross", 4, None, "d3s_top_k", 0.2, None),
        "full": ("d3s_cross", 4, 8, "d3s_top_k", 0.2, 0.6),
    }
    assert base["dataset"]["name"] == "toy_sum" and base["train"]["prompts_per_step"] == 8 and base["train"]["log_strata"]


def test_toy_sum_model_continues_the_shipped_toy_long_model():
    from pods.tiny import ASSETS, asset_name, ensure_tiny

    spec = compose(["experiment=d3s_mixed_grpo_cpu"])["model"]["spec"]
    assert (ASSETS / asset_name(spec["base"])).is_dir() and asset_name(spec["base"]) == "tiny-644515233365"
    assert ensure_tiny(spec).parent == ASSETS  # shipped: no run builds it


def test_window_first_reach_and_predictions_on_a_hand_table():
    assert window([0, 1, 1, 0], 2).tolist() == [0.0, 0.5, 1.0, 0.5]
    assert first_reach(np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.5, 0.4]), 0.5) == 2.0
    assert first_reach(np.array([1.0]), np.array([0.1]), 0.5) is None
    rows = [{"arm": a, "seed": 1, "step": s, "tokens_trained": 10 * s, "accuracy_window": acc}
            for a, accs in (("grpo", [0.1, 0.2, 0.3]), ("cross", [0.3, 0.3, 0.4])) for s, acc in enumerate(accs, 1)]  # fmt: skip
    table = [{"arm": "grpo", "zero_var": 0.3, "acc_test_final": 0.5, "entropy_ratio": None},
             {"arm": "cross", "zero_var": 0.1, "acc_test_final": 0.6, "entropy_ratio": None}]  # fmt: skip
    got = {p["prediction"][:2]: p for p in predictions(table, rows)}
    assert got["a:"]["held"] and got["a:"]["value"] == 0.3
    assert got["b:"]["value"] == 1.0 and got["b:"]["held"]  # cross reaches GRPO's final 0.3 at step 1 <= 2/3 x 3


def test_reported_says_whether_grpo_learned_and_pairs_arms_with_grpo_by_seed_and_step():
    def rows(accs):
        return [{"kind": "train", "step": s, "train_accuracy": a} for s, a in enumerate(accs, 1)]

    runs = {"grpo": {1: rows([0.5] * 12), 2: rows([0.6] * 12)}, "cross": {1: rows([0.0, 0.0] + [0.7] * 10), 3: rows([1.0] * 12)}}
    table = [{"arm": "grpo", "acc_test_final": 0.83, "answer_prob_final": p} for p in (0.80, 0.82)]
    start = {"accuracy": 0.825, "answer_prob": 0.805}
    got = reported(table, runs, start)
    assert got[0]["held"] and got[0]["value"] == [0.83, 0.81]  # answer_prob 0.81 > 0.805, accuracy 0.83 > 0.825
    assert got[1]["seeds"] == [1] and got[1]["value"] == 0.2  # seed 1 only (3 has no GRPO run); the last 10 steps
    table[0]["answer_prob_final"] = 0.70
    assert not reported(table, runs, start)[0]["held"]
    table[0]["answer_prob_final"], table[1]["acc_test_final"] = 0.81, 0.80
    assert not reported(table, runs, start)[0]["held"]  # mean accuracy 0.815 is below the start
    assert reported(table, runs, None)[0]["reported"].startswith("paired")  # no start: no verdict on learning
