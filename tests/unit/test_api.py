"""The public algorithm API (docs/api.md): the names researchers import into their own trainers, and the call
shapes they use, pinned with small real calls on tiny tensors. Expected values are computed by hand in the comments;
plain dicts are passed where callers passed plain dicts before the config became typed."""

from __future__ import annotations

import math

import pytest
import torch

from pods import distributed
from pods.advantages import ADVANTAGES
from pods.backends.base import TokenStats, TrainBatch, build_batch
from pods.downsample import RULES, kept_rows, select
from pods.errors import ConfigError
from pods.losses import AGGREGATIONS, POLICY_LOSSES, k3_kl, token_logprobs
from pods.schema import Algorithm, SparseRl, complete, defaults
from pods.sparse_rl import DEFAULTS, sparse_rl_weights
from pods.tokens import CORRECTIONS, TOKEN_SELECTORS, StepContext

# float32 arithmetic on values of order 1: 1e-6 is ~10 ulps, far below any hand-computed difference tested here
TOL = 1e-6
# what a plain dict of the algorithm section holds at least: its required keys (the rest come from the schema)
WHOLE = {"name": "grpo", "n": 2, "m": 2, "rule": "all"}


def close(actual, expected) -> bool:
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=TOL)


# ---- names -------------------------------------------------------------------------------------------------------


def test_the_names_researchers_import_are_there():
    import pods.advantages
    import pods.backends
    import pods.downsample

    from_downsample = ("select", "kept_rows", "RULES", "max_variance", "max_reward", "random", "all")
    assert all(hasattr(pods.downsample, n) for n in from_downsample)
    assert all(hasattr(pods.advantages, n) for n in ("ADVANTAGES", "grpo", "mean_centered"))
    assert all(hasattr(pods.backends, n) for n in ("build_batch", "TokenStats", "TrainBatch", "BACKENDS", "OPTIMIZERS"))
    assert {"max_variance", "max_reward", "random", "all", "d3s_intra", "d3s_cross"} <= set(RULES.names())
    assert {"grpo", "mean_centered"} <= set(ADVANTAGES.names())
    assert {"all", "d3s_top_k"} <= set(TOKEN_SELECTORS.names())
    assert {"none", "sparse_rl"} <= set(CORRECTIONS.names())
    assert "clipped" in POLICY_LOSSES.names()
    assert {"seq_mean", "token_mean", "bnpo"} <= set(AGGREGATIONS.names())


def test_an_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="max_variance"):
        select("max_varience", torch.zeros(1, 4), 2)


# ---- down-sampling -----------------------------------------------------------------------------------------------


def test_select_keeps_the_max_variance_subset():
    rewards = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 1.0, 0.0]])
    # row 0: {0, 3} has variance 2.25, any other pair at most 1; row 1 (binary): one 0 and one 1, the low part takes
    # the first 0 (column 1), the high part the last 1 (column 2)
    kept = select("max_variance", rewards, 2)
    assert kept.dtype == torch.long and kept.tolist() == [[0, 3], [1, 2]]
    assert select("max_reward", torch.tensor([[1.0, 5.0, 3.0, 2.0]]), 2).tolist() == [[1, 2]]
    assert select("all", rewards, 4).tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    with pytest.raises(ValueError, match="m == n"):
        select("all", rewards, 2)


def test_select_random_is_a_seeded_sorted_subset():
    rewards = torch.zeros(3, 8)
    a = select("random", rewards, 3, generator=torch.Generator().manual_seed(5))
    b = select("random", rewards, 3, generator=torch.Generator().manual_seed(5))
    assert a.shape == (3, 3) and torch.equal(a, b)
    assert all(row == sorted(set(row)) and min(row) >= 0 and max(row) < 8 for row in a.tolist())


def test_kept_rows_are_flat_indices_into_the_step():
    rewards = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 1.0, 0.0]])
    # row g's kept columns + 4 g: [0, 3] and [1 + 4, 2 + 4]
    assert kept_rows("max_variance", rewards, 2).tolist() == [0, 3, 5, 6]
    cross = kept_rows("d3s_cross", rewards, 2)  # over both groups at once: 4 rows, any number per group
    assert cross.shape == (4,) and cross.tolist() == sorted(cross.tolist())


# ---- advantages --------------------------------------------------------------------------------------------------


def test_advantages_by_name():
    r = torch.tensor([[0.0, 1.0], [2.0, 2.0]])
    # row 0: mean 0.5, unbiased std sqrt(0.5); row 1: std 0 -> A = 0
    s = math.sqrt(0.5) + 1e-4
    assert close(ADVANTAGES.get("grpo")(r), [[-0.5 / s, 0.5 / s], [0.0, 0.0]])
    assert close(ADVANTAGES.get("grpo")(r, eps=0.0)[0], [-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)])
    assert close(ADVANTAGES.get("grpo")(torch.tensor([[3.0]])), [[0.0]])  # one rollout: A = 0
    assert close(ADVANTAGES.get("mean_centered")(torch.tensor([[1.0, 3.0]])), [[-1.0, 1.0]])


# ---- losses ------------------------------------------------------------------------------------------------------


def test_clipped_surrogate_and_aggregations():
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.0, math.log(1.5)], [0.0, math.log(1.5)]])  # ratios 1 and 1.5
    loss, clipped = POLICY_LOSSES.get("clipped")(logp, old, torch.tensor([1.0, -1.0]), 0.2, 0.2)
    # A = 1: -min(1.5, 1.2) = -1.2 (clipped); A = -1: -min(-1.5, -1.2) = 1.5 (the pessimistic side, not clipped)
    assert close(loss, [[-1.0, -1.2], [1.0, 1.5]]) and clipped.tolist() == [[False, True], [False, False]]
    per_token, mask = torch.tensor([[1.0, 2.0], [3.0, 5.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert close(AGGREGATIONS.get("seq_mean")(per_token, mask, 2, 3), (1.5 + 3.0) / 2)  # per sequence, then over 2
    assert close(AGGREGATIONS.get("token_mean")(per_token, mask, 2, 3), (1 + 2 + 3) / 3)
    assert close(AGGREGATIONS.get("bnpo")(per_token, mask, 2, 3), 6.0)  # the per-row factor is folded in beforehand


def test_token_logprobs_and_k3():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # p = (1/4, 3/4)
    assert close(token_logprobs(logits, torch.tensor([[1]])), [[math.log(0.75)]])
    # T = 2: logits / 2 -> p(1) = sqrt(3) / (1 + sqrt(3))
    assert close(token_logprobs(logits, torch.tensor([[1]]), 2.0), [[math.log(math.sqrt(3) / (1 + math.sqrt(3)))]])
    assert close(k3_kl(torch.zeros(1, 1), torch.full((1, 1), math.log(2.0))), [[2.0 - math.log(2.0) - 1.0]])


# ---- the training batch ------------------------------------------------------------------------------------------


def test_build_batch_lays_out_prompt_then_completion():
    b = build_batch([[1, 2], [3]], [[4], [5, 6]], [[-0.5], [-0.1, -0.2]], [1.0, -1.0], pad_id=0, groups=[0, 0])
    assert isinstance(b, TrainBatch) and len(b) == 2 and b.prompt_width == 2
    assert b.input_ids.tolist() == [[1, 2, 4, 0], [0, 3, 5, 6]]  # prompts left-padded, completions right-padded
    assert b.attention_mask.tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    assert b.loss_mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert close(b.sampler_logprobs, [[-0.5, 0.0], [-0.1, -0.2]]) and b.advantages.tolist() == [1.0, -1.0]
    assert b.group.tolist() == [0, 0] and b.token_weights is None and b.old_logprobs is None
    assert b.rows(1, 2).input_ids.tolist() == [[0, 3, 5, 6]]
    stats = TokenStats(torch.zeros(2, 2))
    assert stats.entropy is None


# ---- Sparse-RL ---------------------------------------------------------------------------------------------------


def _mismatch():
    """Two sequences of 3 tokens: r = exp(dense - sparse) = (1, 1.2, 0.4) and (1, 1e-5, -) with the last masked."""
    dense = torch.zeros(2, 3)
    sparse = -torch.log(torch.tensor([[1.0, 1.2, 0.4], [1.0, 1e-5, 1.0]]))
    return dense, sparse, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_sparse_rl_weights_with_the_defaults_dict():
    assert isinstance(DEFAULTS, dict) and defaults(SparseRl) == DEFAULTS
    # the released thresholds (slime mis.yaml / mis.py) and pods' normaliser, docs/sparse-rl.md's table
    want = {"veto": 1e-4, "band_low": 0.5, "band_high": 1.5, "cap": 1.5, "log_ratio_clamp": 20.0, "weight_norm": "valid"}
    assert {**want, "norm_scope": "step"} == DEFAULTS
    mask, w, stats = sparse_rl_weights(*_mismatch(), DEFAULTS)
    # row 0: 0.4 is outside [0.5, 1.5] -> masked; row 1: 1e-5 < veto 1e-4 -> the whole sequence dropped
    assert mask.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    # weights min(r, 1.5) on valid tokens, divided by their mean over the kept tokens, (1 + 1.2) / 2 = 1.1
    assert close(w, [[1 / 1.1, 1.2 / 1.1, 0.4 / 1.1], [1 / 1.1, 1e-5 / 1.1, 0.0]])
    assert (stats["rejected"], stats["seqs"], stats["out_of_band"], stats["tokens"]) == (1.0, 2.0, 2.0, 5.0)


def test_sparse_rl_weights_with_a_plain_dict_of_its_own():
    _, w, _ = sparse_rl_weights(*_mismatch(), {**DEFAULTS, "weight_norm": "none", "cap": 1.1})
    assert close(w[0], [1.0, 1.1, 0.4])  # capped at 1.1, not normalised


def test_the_sparse_rl_correction_through_step_context():
    dense, sparse, _ = _mismatch()
    batch = build_batch([[1]] * 2, [[2, 3, 4], [2, 3]], sparse.tolist(), [1.0, -1.0], pad_id=0)
    ctx = StepContext(
        alg={**WHOLE, "correction": "sparse_rl", "sparse_rl": {"cap": 1.5}}, progress=0.0, dist=distributed.SINGLE, stats=TokenStats(dense)
    )
    metrics = CORRECTIONS.get("sparse_rl")(batch, ctx)
    assert batch.loss_mask.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert close(batch.token_weights[0, :2], [1 / 1.1, 1.2 / 1.1])
    assert close(metrics["sparse_rl_rejected_frac"], 0.5)


# ---- token selection and the typed sections ----------------------------------------------------------------------


def test_step_context_takes_a_section_or_a_plain_dict_of_a_whole_one():
    batch = build_batch([[1]] * 2, [[2, 3], [4, 5]], [[0.0, 0.0]] * 2, [1.0, -2.0], pad_id=0)
    stats = TokenStats(torch.zeros(2, 2), torch.tensor([[1.0, 2.0], [0.1, 3.0]]))
    # |A| x entropy = [[1, 2], [0.2, 6]]: the top half of the 4 tokens are 6 and 2
    for alg in (complete(Algorithm, WHOLE, token_keep=0.5), {**WHOLE, "token_keep": 0.5, "token_keep_final": None, "ramp": "linear"}):
        b = build_batch([[1]] * 2, [[2, 3], [4, 5]], [[0.0, 0.0]] * 2, [1.0, -2.0], pad_id=0)
        TOKEN_SELECTORS.get("d3s_top_k")(b, StepContext(alg, 0.0, distributed.SINGLE, stats))
        assert b.loss_mask.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    ctx = StepContext(alg=complete(Algorithm, WHOLE), progress=0.5, dist=distributed.SINGLE)
    assert ctx.stats is None and isinstance(StepContext(WHOLE, 0.0, distributed.SINGLE).alg, Algorithm)  # the dict is typed
    assert TOKEN_SELECTORS.get("all")(batch, ctx) == {} and CORRECTIONS.get("none")(batch, ctx) == {}
    assert batch.loss_mask.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_complete_fills_the_defaults_then_the_node_then_the_values():
    a = complete(Algorithm, {"name": "pods", "n": 8, "m": 4}, m=2, rule="max_variance")  # defaults, then the node, then the values
    assert (a.n, a.m, a.rule) == (8, 2, "max_variance")
    assert a.advantage == defaults(Algorithm)["advantage"] and a.beta == defaults(Algorithm)["beta"]
    assert complete(Algorithm, a, m=4).m == 4 and a.m == 2  # a section as the node: its fields, validated again; a kept as it was


# ---- bad dicts at the public doors: one line naming the key, before anything runs ---------------------------------


def _one_line(e: pytest.ExceptionInfo) -> str:
    assert isinstance(e.value, ValueError) and isinstance(e.value, ConfigError)
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)
    return str(e.value)


def test_a_bad_algorithm_dict_is_refused_in_one_line_never_typed_as_it_is():
    with pytest.raises(ConfigError) as e:
        Algorithm.of({"n": "lots", "m": -3})
    assert _one_line(e).startswith("algorithm.n must be an integer, got 'lots'")
    with pytest.raises(ConfigError) as e:
        complete(Algorithm, WHOLE, m=3)  # a section's own rule: m <= n
    assert _one_line(e) == "algorithm.m (3) must be <= algorithm.n (2): m rollouts are kept out of n"
    with pytest.raises(ConfigError, match="algorithm.name is required"):
        complete(Algorithm, n=2, m=2, rule="all")  # a dict of a few keys is no section: the required ones are named


def test_every_public_function_that_takes_a_section_refuses_a_bad_dict_in_one_line():
    batch = build_batch([[1]] * 2, [[2, 3], [4, 5]], [[0.0, 0.0]] * 2, [1.0, -2.0], pad_id=0)
    dense, sparse, mask = _mismatch()
    calls = {
        "algorithm.token_keep must be <= 1": lambda: StepContext({**WHOLE, "token_keep": 2.0}, 0.0, distributed.SINGLE),
        "algorithm.sparse_rl.cap must be > 0": lambda: CORRECTIONS.get("sparse_rl")(
            batch, StepContext({**WHOLE, "sparse_rl": {"cap": -1}}, 0.0, distributed.SINGLE, TokenStats(torch.zeros(2, 2)))
        ),
        "algorithm.sparse_rl.weight_norm must be one of": lambda: sparse_rl_weights(
            dense, sparse, mask, {**DEFAULTS, "weight_norm": "mean"}
        ),
        "algorithm.sparse_rl.capp: unknown key; did you mean 'algorithm.sparse_rl.cap'?": lambda: sparse_rl_weights(
            dense, sparse, mask, {"capp": 1.5}
        ),
        "algorithm.m_intra must be an integer": lambda: kept_rows(
            "d3s_two_stage", torch.zeros(2, 4), 2, alg={**WHOLE, "n": 4, "rule": "d3s_two_stage", "m_intra": "three"}
        ),
    }
    for message, call in calls.items():
        with pytest.raises(ConfigError) as e:
            call()
        assert _one_line(e).startswith(message), (message, str(e.value))
