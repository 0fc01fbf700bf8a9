"""D3S experiment files: the values read from the D3S paper and the values chosen where the sources read here
are silent (docs/d3s.md says which is which), typed in here, never read back from the YAML."""

from __future__ import annotations

import pytest

from support.config import compose, shrink


def get(cfg: dict, dotted: str):
    for k in dotted.split("."):
        cfg = cfg[k]
    return cfg


D3S_COMMON = {  # from the paper (arXiv 2509.22115): GRPO base, advantages on the full group, |A| x H tokens, linear ramp
    "algorithm.advantage_scope": "group",
    "algorithm.advantage": "grpo",
    "algorithm.policy_loss": "clipped",
    "algorithm.token_rule": "d3s_top_k",
    "algorithm.ramp": "linear",
    "eval.suite": "d3s",  # Table 1's Avg@32 and Pass@8 on 7 benchmarks, once at the end
}
CHOSEN = {  # not in the sources read here: chosen, pinned so that a change is deliberate
    "algorithm.n": 16,
    "algorithm.m": 4,
    "algorithm.m_final": 12,
    "algorithm.token_keep": 0.2,
    "algorithm.token_keep_final": 0.6,
    "algorithm.beta": 0.0,
    "algorithm.loss_agg": "token_mean",
    "optim.lr": 1e-6,
    "sampling.temperature": 1.0,
    "sampling.max_tokens": 2048,
    "train.prompts_per_step": 16,
    "train.max_steps": 300,
    "dataset.name": "math",
    "dataset.prompt_format": "boxed",  # the suite's prompt: one format for training and evaluation (issue 29 item 5)
    "eval.repeats": 4,  # in-loop MATH-500 curve only (32 in-loop cost ~2 h per seed); the suite samples 32
    "train.checkpoint_every_s": 3600,  # 107 GB of ZeRO shards per save (7B): not every 600 s
    "train.keep_checkpoints": 1,
    "dataset.recipe": "correctness",
    "dataset.grader": "math_verify",
    "hardware.name": "h100x8_zero3",
    "hardware.finetune": "full",
}
PAPER = {
    "d3s_qwen2_5_math_7b_grpo_h100x8": {**D3S_COMMON, **CHOSEN, "model.path": "Qwen/Qwen2.5-Math-7B", "algorithm.rule": "d3s_cross_step"},
    "d3s_qwen2_5_math_7b_gspo_h100x8": {  # GSPO (arXiv 2507.18071) as the base: its sequence ratio and clip ranges
        **D3S_COMMON,
        **CHOSEN,
        "model.path": "Qwen/Qwen2.5-Math-7B",
        "algorithm.rule": "d3s_cross_step",
        "algorithm.policy_loss": "gspo",
        "algorithm.epsilon": 3e-4,
        "algorithm.epsilon_high": 4e-4,
        "algorithm.loss_agg": "seq_mean",
    },
    "d3s_qwen2_5_math_1_5b_grpo_h100x8": {  # Table 3's model; the 7B setting's chosen values, a larger micro-batch (chosen)
        **D3S_COMMON,
        **CHOSEN,
        "model.path": "Qwen/Qwen2.5-Math-1.5B",
        "algorithm.rule": "d3s_cross_step",
        "hardware.micro_batch_size": 16,
    },
    "d3s_llama3_1_8b_grpo_h100x8": {
        **D3S_COMMON,
        **CHOSEN,
        "model.path": "meta-llama/Llama-3.1-8B-Instruct",
        "algorithm.rule": "d3s_intra",
    },
}
BASES = sorted(PAPER)  # each D3S setting has a baseline (the base algorithm alone) and the base algorithm + PODS
BASELINE = {"algorithm.n": 16, "algorithm.m": 16, "algorithm.rule": "all", "algorithm.token_rule": "all", "algorithm.m_final": None}
WITH_PODS = {
    "algorithm.n": 16,
    "algorithm.m": 4,
    "algorithm.rule": "max_variance",
    "algorithm.token_rule": "all",
    "algorithm.m_final": None,
}
CPU = {  # experiment -> (algorithm.name, n, N at p = 0 per group, token rule)
    "d3s_toy_cpu": ("d3s", 16, 4, "d3s_top_k"),
    "d3s_cross_toy_cpu": ("d3s_cross", 16, 4, "d3s_top_k"),
    "d3s_tokens_pods_toy_cpu": ("grpo_pods", 64, 16, "d3s_top_k"),
}


@pytest.mark.parametrize("exp", sorted(PAPER))
def test_d3s_paper_values(exp):
    cfg = compose([f"experiment={exp}"])
    assert {k: get(cfg, k) for k in PAPER[exp]} == PAPER[exp]


@pytest.mark.parametrize("d3s", BASES)
@pytest.mark.parametrize("kind", ["baseline", "pods"])
def test_d3s_baselines_differ_from_their_d3s_file_only_in_the_algorithm(d3s, kind):
    """Table 1's comparison rows (issue 29 item 5): every section but ``algorithm`` equal to the D3S file's, resolved;
    the algorithm is the D3S file's base (its loss, clipping, normaliser) without D3S's selection, or with PODS's."""
    from pods.schema import check

    ref = compose([f"experiment={d3s}"])
    cfg = compose([f"experiment={d3s.removesuffix('_h100x8')}_{kind}_h100x8"])
    check(cfg)  # validates
    assert sorted(k for k in set(cfg) | set(ref) if cfg.get(k) != ref.get(k)) == ["algorithm"]
    want = BASELINE if kind == "baseline" else WITH_PODS
    assert {k: get(cfg, k) for k in want} == want
    assert get(cfg, "algorithm.name") == ("grpo" if kind == "baseline" else "grpo_pods")
    base = ("policy_loss", "epsilon", "epsilon_high", "loss_agg", "beta", "advantage", "loss_temperature")
    assert {k: cfg["algorithm"][k] for k in base} == {k: ref["algorithm"][k] for k in base}


@pytest.mark.parametrize("exp", sorted(CPU))
def test_d3s_cpu_settings(exp):
    cfg = compose([f"experiment={exp}"])
    a = cfg["algorithm"]
    assert (a["name"], a["n"], a["m"], a["token_rule"]) == CPU[exp]
    assert (a["token_keep"], a["token_keep_final"], a["ramp"]) == (0.2, 0.6, "linear")
    assert cfg["model"]["builder"] == "tiny" and cfg["train"]["time_budget_s"] == 60 and cfg["train"]["prompts_per_step"] == 2


def test_d3s_cpu_sweep_runs_the_four_arms_with_their_own_n_and_m():
    from pods.figures import sweep_jobs

    jobs, _ = sweep_jobs("d3s_toy_cpu", "d3s_cpu")
    assert jobs[:4] == [["seed=1", f"algorithm={a}"] for a in ("grpo", "grpo_pods", "d3s", "d3s_cross")] and len(jobs) == 12
    got = {}
    for job in jobs[:4]:
        a = compose(["experiment=d3s_toy_cpu", "+sweep=d3s_cpu", *job])["algorithm"]
        got[a["name"]] = (a["n"], a["m"], a["rule"], a.get("advantage_scope") or "kept", a["token_rule"])
    assert got == {
        "grpo": (16, 16, "all", "kept", "all"),
        "grpo_pods": (64, 16, "max_variance", "kept", "all"),
        "d3s": (16, 4, "d3s_intra", "group", "d3s_top_k"),
        "d3s_cross": (16, 4, "d3s_cross", "group", "d3s_top_k"),
    }


@pytest.mark.slow
def test_pods_plus_d3s_tokens_cpu_experiment_runs(tiny_dir, tmp_path):
    """The composition arm as committed (shrunk to 2 steps, n = 16 -> 4): PODS keeps 4 of each group by reward
    variance, D3S drops tokens by |A| x entropy."""
    from pods.config import validate
    from pods.loop import train
    from pods.metrics import read_metrics

    cfg = shrink(compose(["experiment=d3s_tokens_pods_toy_cpu", "algorithm.n=16", "algorithm.m=4"]))
    train(validate(cfg), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert len(rows) == 2 and all(r["kept"] == 8 and 0 < r["tokens_kept_frac"] < 1 for r in rows)
    assert rows[0]["token_keep"] == pytest.approx(0.2) and rows[1]["token_keep"] == pytest.approx(0.4)  # p = 0, 1/2
