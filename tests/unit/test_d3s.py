"""D3S (pods.d3s): sample rules against brute force, the token selector on a hand-computed batch, the (N, K)
schedule, the masked loss under gradient accumulation, config errors, and the loop with real components."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from pods import distributed
from pods.advantages import grpo
from pods.backends.base import TokenStats, build_batch
from pods.d3s import cross_group, cross_step, intra_group, ramped, token_fraction, top_k_tokens, two_stage
from pods.downsample import kept_rows, max_variance
from pods.losses import AGGREGATIONS
from pods.plan import kept_per_group
from pods.schema import Algorithm, check, complete
from pods.tokens import StepContext
from support.config import ALGORITHM, compose, shrink
from support.harness import max_gap, within


def pop_var(x: list[float]) -> float:
    mu = sum(x) / len(x)
    return sum((v - mu) ** 2 for v in x) / len(x)


def best_var(values: list[float], m: int) -> float:
    return max(pop_var([values[i] for i in c]) for c in itertools.combinations(range(len(values)), m))


def reward_rows(seed: int, G: int, n: int) -> torch.Tensor:
    """Rewards with ties, equal values and zero-variance groups: binary, 3-level, constant and continuous rows."""
    g = torch.Generator().manual_seed(seed)
    rows = [
        torch.randint(0, 2, (n,), generator=g).double(),
        torch.randint(0, 3, (n,), generator=g).double() * 0.4,
        torch.full((n,), 0.8, dtype=torch.float64),
        torch.rand(n, generator=g, dtype=torch.float64),
        torch.tensor([1.0] + [0.0] * (n - 1), dtype=torch.float64),
    ]
    return torch.stack([rows[i % len(rows)] for i in range(G)])


@pytest.mark.parametrize("n", [2, 5, 7])
def test_intra_group_is_the_max_variance_subset_of_the_full_group_advantages(n):
    rewards = reward_rows(n, 10, n)
    adv = grpo(rewards)  # normalised on the FULL group of n
    for m in range(1, n + 1):
        kept = intra_group(adv, m)
        assert kept.shape == (10, m)
        for g in range(10):
            idx = kept[g].tolist()
            assert idx == sorted(set(idx))
            got = pop_var(adv[g, idx].tolist())
            assert got == pytest.approx(best_var(adv[g].tolist(), m), abs=1e-9), (g, m)
        # same SET as PODS' max-variance on rewards: A is an increasing affine map of r within a group (or 0)
        assert torch.equal(kept, max_variance(rewards, m))


def test_intra_group_keeps_the_extremes_n_pos_plus_n_neg():
    """One correct answer of 8: the max-Var(A) subset of 4 is the positive outlier + 3 of the 7 equal negatives,
    not 2 + 2 (a fixed half-and-half split cannot be the argmax here)."""
    adv = grpo(torch.tensor([[0.0, 0, 1, 0, 0, 0, 0, 0]], dtype=torch.float64))
    kept = intra_group(adv, 4)[0].tolist()
    assert 2 in kept and (adv[0, kept] > 0).sum() == 1
    assert pop_var(adv[0, kept].tolist()) == pytest.approx(best_var(adv[0].tolist(), 4))


@pytest.mark.parametrize("G,n", [(2, 3), (3, 4), (4, 3), (2, 6)])
def test_cross_group_is_the_max_variance_subset_of_the_whole_step(G, n):
    for seed in range(4):
        adv = grpo(reward_rows(seed, G, n))
        flat = adv.flatten().tolist()
        for m in range(1, n + 1):
            rows = cross_group(adv, m)
            assert rows.shape == (G * m,) and rows.tolist() == sorted(set(rows.tolist()))
            assert pop_var([flat[i] for i in rows.tolist()]) == pytest.approx(best_var(flat, G * m), abs=1e-9), (seed, m)
            assert torch.equal(kept_rows("d3s_cross", adv, m), rows)


def test_cross_group_skips_zero_variance_groups_and_does_not_renormalise():
    rewards = torch.tensor([[1.0, 1, 1, 1], [1.0, 0, 0, 0], [0.0, 0, 1, 1]], dtype=torch.float64)
    adv = grpo(rewards)  # group 0 has A = 0 everywhere
    rows = cross_group(adv, 2).tolist()  # 6 of 12
    assert not any(r // 4 == 0 for r in rows)  # the all-correct group gives nothing
    assert sorted(r // 4 for r in rows).count(1) == 2 and sorted(r // 4 for r in rows).count(2) == 4  # unequal per group
    # the kept advantages are the full-group ones (group 1: the 1.0 of one correct in 4 is +1.5 / (std + eps))
    assert adv.flatten()[4].item() == pytest.approx(0.75 / (0.5 + 1e-4))


def test_cross_step_on_one_process_is_cross_group():
    adv = grpo(reward_rows(5, 4, 6))
    for m in range(1, 7):
        assert torch.equal(kept_rows("d3s_cross_step", adv, m, dist=distributed.SINGLE), cross_group(adv, m))


@pytest.mark.parametrize("G,n", [(2, 4), (3, 3), (2, 6)])
def test_two_stage_is_exact_at_each_stage_against_brute_force(G, n):
    """Stage 1 keeps per group an m_intra-subset of maximal Var(A); stage 2 keeps, of their union, a G x m-subset of
    maximal Var(A) (brute force over all subsets at both stages)."""
    for seed in range(3):
        adv = grpo(reward_rows(seed + 7, G, n))
        flat = adv.flatten().tolist()
        for m_intra in range(1, n + 1):
            union = []
            for g in range(G):  # stage 1, by brute force: the optimal variance per group
                first = kept_rows("max_variance", adv[g : g + 1], m_intra)
                assert pop_var(adv[g, first].tolist()) == pytest.approx(best_var(adv[g].tolist(), m_intra), abs=1e-9)
                union += (first + g * n).tolist()
            for m in range(1, m_intra + 1):
                rows = two_stage(adv, m, m_intra=m_intra)
                assert rows.tolist() == sorted(set(rows.tolist())) and set(rows.tolist()) <= set(union)
                got = pop_var([flat[i] for i in rows.tolist()])
                assert got == pytest.approx(best_var([flat[i] for i in union], G * m), abs=1e-9), (seed, m_intra, m)
                assert got <= best_var(flat, G * m) + 1e-9  # never above the one-stage optimum
        assert torch.equal(two_stage(adv, 2), cross_step(adv, 2))  # m_intra = n: one stage


def test_two_stage_can_miss_the_one_stage_optimum():
    """Group 0 holds the step's three highest advantages; with m_intra = 1 the first stage keeps only one of them."""
    adv = torch.tensor([[3.0, 2.9, 2.8, -1.0], [0.1, 0.0, -0.1, -3.0]], dtype=torch.float64)
    one = set(cross_step(adv, 2).tolist())
    two = set(two_stage(adv, 2, m_intra=2).tolist())
    flat = adv.flatten().tolist()
    assert pop_var([flat[i] for i in two]) < pop_var([flat[i] for i in one])


def test_kept_rows_passes_the_rules_options_from_the_algorithm_section():
    adv = grpo(reward_rows(2, 3, 6))
    alg = complete(Algorithm, name="d3s", rule="d3s_two_stage", n=6, m=2, m_intra=3)
    assert torch.equal(kept_rows("d3s_two_stage", adv, 2, alg=alg), two_stage(adv, 2, m_intra=3))


def test_select_rows_scopes():
    """``kept`` scope: advantages normalised over each group's kept rollouts (0 elsewhere); ``group`` scope: the
    full group's, for every rollout."""
    from pods.loop.rollouts import Rows, select_rows

    rewards = reward_rows(4, 3, 5)
    kept, adv = select_rows(complete(Algorithm, name="pods", rule="max_reward", n=5, m=2, advantage_scope="kept"), rewards, 2)
    expected = grpo(rewards.flatten()[kept].view(3, 2)).float().flatten()
    assert torch.equal(adv[kept], expected) and adv.sum() == adv[kept].sum() and adv.shape == (15,)
    kept, adv = select_rows(complete(Algorithm, name="d3s", rule="d3s_cross", n=5, m=2, advantage_scope="group"), rewards, 2)
    assert torch.equal(adv, grpo(rewards).flatten().float()) and torch.equal(kept, cross_group(grpo(rewards), 2))
    every = Rows(
        *([[f"row{i}" for i in range(15)]] * 3),
        adv.tolist(),
        rewards.flatten().tolist(),
        [i // 5 for i in range(15)],
        [False] * 15,
        [0] * 15,
    )
    rows = every.take(kept, "d3s_cross", distributed.SINGLE)
    assert rows.prompt == [f"row{i}" for i in kept.tolist()] and rows.adv == adv[kept].tolist() and len(rows) == len(kept)
    assert rows.group == [i // 5 for i in kept.tolist()] and rows.reward == rewards.flatten()[kept].tolist()


def test_kept_rows_of_a_per_group_rule_are_flat_row_indices():
    rewards = reward_rows(3, 3, 5)
    kept = max_variance(rewards, 2)
    assert torch.equal(kept_rows("max_variance", rewards, 2), (kept + 5 * torch.arange(3).unsqueeze(1)).flatten())


# ---- token level --------------------------------------------------------------------------------------------
def hand_batch():
    """Two sequences: A = +1 with 4 tokens, A = -2 with 3 tokens (+1 pad whose entropy must never count)."""
    batch = build_batch([[5, 6], [7]], [[10, 11, 12, 13], [14, 15, 16]], [[0.0] * 4, [0.0] * 3], torch.tensor([1.0, -2.0]), 0)
    H = torch.tensor([[0.5, 2.0, 1.0, 0.0], [0.5, 0.25, 0.5, 9.0]])
    return batch, TokenStats(torch.zeros(2, 4), H)


def test_token_selection_by_abs_advantage_times_entropy_hand_computed():
    """Scores |A| x H: row 0 = [0.5, 2.0, 1.0, 0.0], row 1 = [1.0, 0.5, 1.0, pad]. K = 3/7 of the 7 tokens keeps 3:
    the 2.0, then a tie of three 1.0s (row 0 col 2, row 1 cols 0 and 2) of which the two earliest win."""
    batch, stats = hand_batch()
    alg = complete(Algorithm, ALGORITHM, token_keep=3 / 7)
    m = top_k_tokens(batch, StepContext(alg=alg, progress=0.3, dist=distributed.SINGLE, stats=stats))
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    assert m["tokens_kept_frac"] == pytest.approx(3 / 7)
    assert m["entropy_kept"] == pytest.approx((2.0 + 1.0 + 0.5) / 3)
    assert m["entropy_dropped"] == pytest.approx((0.5 + 0.0 + 0.25 + 0.5) / 4)


def test_token_top_k_is_over_the_whole_step_not_per_micro_batch():
    """Per micro-batch (one row each) 3/7 would keep ceil(3/7 x 4) = 2 of row 0 and ceil(3/7 x 3) = 2 of row 1;
    the step-wide selection keeps 2 + 1, and a micro-batch split of the result leaves it unchanged."""
    batch, stats = hand_batch()
    top_k_tokens(
        batch, StepContext(alg=complete(Algorithm, ALGORITHM, token_keep=3 / 7), progress=0.0, dist=distributed.SINGLE, stats=stats)
    )
    assert batch.loss_mask.sum(1).tolist() == [2, 1]


def test_token_selection_keeps_every_token_at_k_1_and_the_schedule_moves_k():
    batch, stats = hand_batch()
    before = batch.loss_mask.clone()
    alg = complete(Algorithm, ALGORITHM, token_keep=0.2, token_keep_final=1.0, ramp="linear")
    m = top_k_tokens(batch, StepContext(alg=alg, progress=1.0, dist=distributed.SINGLE, stats=stats))
    assert torch.equal(batch.loss_mask, before) and m["token_keep"] == 1.0 and m["entropy_dropped"] == 0.0


def test_schedule_values_at_progress_0_half_1():
    alg = complete(Algorithm, name="d3s", n=8, m=4, rule="d3s_intra", m_final=8, token_keep=0.2, token_keep_final=0.6, ramp="linear")
    assert [kept_per_group(alg, p) for p in (0, 0.5, 1)] == [4, 6, 8]
    assert [token_fraction(alg, p) for p in (0, 0.5, 1)] == pytest.approx([0.2, 0.4, 0.6])
    assert kept_per_group(complete(Algorithm, alg, m_final=7), 0.5) == 6  # 5.5 rounds half up
    assert kept_per_group(complete(Algorithm, alg, m_final=None), 0.7) == 4  # no schedule: N = m
    assert ramped(0.2, 0.6, 0.5, "cosine") == pytest.approx(0.4) and ramped(0.2, 0.6, 0.25, "cosine") == pytest.approx(
        0.2 + 0.4 * (1 - math.cos(math.pi / 4)) / 2
    )
    assert ramped(0.2, 0.6, 0.9, "constant") == 0.2
    assert kept_per_group(alg, 1.7) == 8 and token_fraction(alg, -1) == pytest.approx(0.2)  # clamped to [0, 1]


def test_token_selection_with_no_live_token_keeps_nothing():
    """Every token already out of the loss (e.g. a correction vetoed every sequence): nothing kept, no error."""
    batch, stats = hand_batch()
    batch.loss_mask.zero_()
    m = top_k_tokens(
        batch, StepContext(alg=complete(Algorithm, ALGORITHM, token_keep=0.5), progress=0.0, dist=distributed.SINGLE, stats=stats)
    )
    assert batch.loss_mask.sum() == 0
    assert m["tokens_kept_frac"] == 0.0 and m["entropy_kept"] == 0.0 and m["entropy_dropped"] == 0.0


def test_sparse_rl_veto_of_every_sequence_then_d3s_tokens_keeps_nothing(tiny_dir):
    """The composition docs/sparse-rl.md advertises, on a step where the correction rejects every sequence (the
    sampler's log-probs 12 nats above the tiny model's own: ratio e^-12 < 1e-4 on every token): the correction, then
    the token selector (real entropy pre-pass), run without raising and leave no token in the loss."""
    from pods import tokens
    from pods.backends.local import LocalBackend

    cfg = check(compose(["algorithm=d3s", "algorithm.correction=sparse_rl"]))
    backend = LocalBackend(str(tiny_dir), cfg)
    batch, _ = hand_batch()
    batch.sampler_logprobs = (backend.policy_stats(batch).logprobs + 12.0) * batch.loss_mask
    m = tokens.apply(batch, backend, cfg.algorithm, 0.0, distributed.SINGLE)
    assert batch.loss_mask.sum() == 0 and m["sparse_rl_rejected_frac"] == 1.0 and m["tokens_kept_frac"] == 0.0
    assert m["sparse_rl_weight_max"] == 0.0 and m["sparse_rl_weight_mean"] == 0.0


def test_seq_mean_counts_a_sequence_with_no_kept_tokens_as_zero_loss():
    """Documented choice: such a sequence stays in n_seqs (its loss term is 0); token_mean divides by kept tokens."""
    per_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert AGGREGATIONS.get("seq_mean")(per_tok, mask, 2, 2).item() == pytest.approx(2.5 / 2)
    assert AGGREGATIONS.get("token_mean")(per_tok, mask, 2, 2).item() == pytest.approx(5.0 / 2)


# ---- the masked loss under gradient accumulation, with the real tiny model -----------------------------------
def test_masked_loss_gradient_is_the_same_in_micro_batches(tiny_dir):
    """The D3S token mask (real entropy pre-pass) then one AdamW step (eps = 1: the step follows the gradient's
    scale): micro-batches of 2 with accumulation give the weights of one batch of 8."""
    from pods import tokens
    from pods.backends.local import LocalBackend

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 290, (int(k),), generator=g).tolist() for k in torch.randint(3, 9, (8,), generator=g)]
    comps = [torch.randint(10, 290, (int(k),), generator=g).tolist() for k in torch.randint(1, 13, (8,), generator=g)]
    signs = torch.randn(8, generator=torch.Generator().manual_seed(1)).sign()  # |A| = 1: the score |A| x H ranks by H alone
    after, norms = [], []
    for micro in (8, 2):
        cfg = check(compose(["algorithm=d3s", f"hardware.micro_batch_size={micro}", "optim.eps=1.0", "algorithm.beta=0.04"]))
        backend = LocalBackend(str(tiny_dir), cfg)
        batch = build_batch(prompts, comps, [[0.0] * len(c) for c in comps], signs, 0)
        m = tokens.apply(batch, backend, cfg.algorithm, 0.5, distributed.SINGLE)
        assert 0 < m["tokens_kept_frac"] < 1 and m["entropy_kept"] > m["entropy_dropped"]  # the top half by entropy
        stats = backend.update(batch, lr=0.5)
        after.append({k: v.clone() for k, v in backend.model.state_dict().items()})
        norms.append(stats["grad_norm"])
    within(abs(norms[0] - norms[1]) / abs(norms[1]), 1e-5, "grad norm (relative), micro-batches of 2 vs 8")
    within(max(max_gap(after[0][k], after[1][k]) for k in after[0]), 2e-6, "weights, micro-batches of 2 vs 8")


# ---- configuration ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,key",
    [
        (["algorithm=d3s", "algorithm.token_keep=0"], "algorithm.token_keep"),
        (["algorithm=d3s", "algorithm.token_keep_final=1.5"], "algorithm.token_keep_final"),
        (["algorithm=d3s", "algorithm.m_final=17"], "algorithm.m_final"),
        (["algorithm=d3s_cross", "algorithm.advantage_scope=kept"], "algorithm.advantage_scope"),
        (["algorithm=d3s", "algorithm.advantage_scope=batch"], "algorithm.advantage_scope"),
        (["algorithm=d3s", "algorithm.ramp=cubic"], "algorithm.ramp"),
        (["algorithm=d3s", "algorithm.rule=d3s_two_stage", "algorithm.m_intra=5"], "algorithm.m_intra"),  # < m_final 8
        (["algorithm=d3s", "algorithm.rule=d3s_cross_step", "algorithm.advantage_scope=kept"], "algorithm.advantage_scope"),
        (["algorithm=grpo_pods", "algorithm.token_rule=d3s_top_k"], "algorithm.token_keep"),
    ],
)
def test_bad_d3s_settings_fail_with_the_key(overrides, key):
    from pods.config import ConfigError, validate

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose(overrides))


# ---- the loop, with the real engine and backend --------------------------------------------------------------
@pytest.mark.parametrize("alg,rule", [("d3s", "d3s_intra"), ("d3s_cross", "d3s_cross"), ("d3s_cross", "d3s_cross_step")])
def test_loop_trains_on_full_group_advantages_of_the_kept_rollouts(alg, rule, tiny_dir, tmp_path, monkeypatch):
    """Records what the loop scores and builds: the batch's advantages are the FULL-group ones of the rows the
    rule picked from them (no re-normalisation), N follows the schedule, and the token metrics are logged."""
    import pods.loop as loop
    import pods.loop.learn as learn  # where the loop's step (5b) builds the batch
    import pods.loop.rollouts as refill  # where the loop's steps (2)-(3) generate and score
    from pods.config import validate
    from pods.metrics import read_metrics

    seen = {"rewards": [], "adv": []}
    score, build = refill.score_batch, learn.build_batch
    monkeypatch.setattr(refill, "score_batch", lambda *a, **k: seen["rewards"].append(r := score(*a, **k)) or r)
    monkeypatch.setattr(learn, "build_batch", lambda *a, **k: seen["adv"].append(torch.as_tensor(a[3])) or build(*a, **k))
    cfg = shrink(compose([f"algorithm={alg}", f"algorithm.rule={rule}", "algorithm.n=8", "algorithm.m=2", "algorithm.m_final=6"]), steps=2)
    loop.train(validate(cfg), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl", "train")
    G = cfg["train"]["prompts_per_step"]
    assert [r["kept"] for r in rows] == [G * 2, G * 4]  # N(0) = 2, N(1/2) = 4
    for step, (scores, adv) in enumerate(zip(seen["rewards"], seen["adv"])):
        full = grpo(torch.tensor([s.reward for s in scores], dtype=torch.float64).view(G, 8))
        kept = kept_rows(cfg["algorithm"]["rule"], full, [2, 4][step])
        assert torch.allclose(adv, full.flatten()[kept].float())
    assert all(0 < r["tokens_kept_frac"] <= 1 and r["tokens_trained"] < r["tokens"] for r in rows)
    assert all({"entropy_kept", "entropy_dropped", "token_keep", "grad_norm"} <= set(r) for r in rows)
