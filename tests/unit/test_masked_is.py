"""Masked importance sampling (``algorithm.correction_mode=mask``) and the lower bound ``algorithm.correction_low``
of ``behaviour_is`` (pods.behaviour_is), and the mismatch diagnostics logged beside ``sampler_gap``
(``mismatch_k3``, ``log_ppl_gap``: pods.backends.gap) with the warning of an asynchronous run without a correction:
hand-computed [B, C] batches, element-by-element brute force, the composition with D3S through ``pods.tokens.apply``
(real pre-pass on the tiny model) and the one-line refusals."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from test_correction import _batch, _ctx, _random_batch, backend, close  # noqa: F401  (backend: the module's fixture)

from pods import distributed, tokens
from pods.backends.gap import GapCheck, add_gap, gap_sums
from pods.behaviour_is import behaviour_is, behaviour_weights
from pods.errors import ConfigError
from pods.schema import check
from support.config import compose


def test_token_mask_zeroes_the_tokens_outside_the_bounds_and_keeps_the_others_exact():
    # ratios 0.5 (below c = 0.6: 0), 3.0 (above C = 2: 0), 1.0, 1.9 (kept as they are), 0.25 (0)
    batch, old = _batch([[0.5, 3.0, 1.0], [1.9, 0.25]])
    m = behaviour_is(batch, _ctx(old, correction_mode="mask", correction_low=0.6))
    close(batch.token_weights, [[0.0, 0.0, 1.0], [1.9, 0.0, 0.0]])
    assert batch.loss_mask.tolist() == [[1, 1, 1], [1, 1, 0]]  # zero weights: the tokens stay in the normalisers
    assert m["bis_clipped_frac"] == pytest.approx(3 / 5) and m["bis_weight_mean"] == pytest.approx(2.9 / 5)


def test_sequence_mask_drops_whole_rows_whose_geometric_mean_leaves_the_bounds():
    # row 0: (0.5 * 2 * 4)^(1/3) = 1.587 (kept, every token) ; row 1: (4 * 4)^(1/2) = 4 > C = 3 (dropped) ;
    # row 2: (0.1 * 0.4)^(1/2) = 0.2 < c = 0.5 (dropped) ; row 3: (1.2)^1 (kept)
    batch, old = _batch([[0.5, 2.0, 4.0], [4.0, 4.0], [0.1, 0.4], [1.2]])
    m = behaviour_is(batch, _ctx(old, correction_level="sequence", correction_mode="mask", correction_clip=3.0, correction_low=0.5))
    c = 4 ** (1 / 3)
    close(batch.token_weights, [[c, c, c], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.2, 0.0, 0.0]])
    assert m["bis_clipped_frac"] == pytest.approx(4 / 8) and m["bis_weight_max"] == pytest.approx(c)


def test_truncate_with_a_lower_bound_clamps_from_below():
    batch, old = _batch([[0.5, 3.0, 1.0], [1.9, 0.25]])
    m = behaviour_is(batch, _ctx(old, correction_low=0.6))
    close(batch.token_weights, [[0.6, 2.0, 1.0], [1.9, 0.6, 0.0]])
    assert m["bis_clipped_frac"] == pytest.approx(3 / 5)


def _brute(old, beh, mask, level, clip, low, mode):
    """Element by element, in Python floats: the definitions in pods/behaviour_is.py's docstring."""
    B, C = len(mask), len(mask[0])
    w, out = [[0.0] * C for _ in range(B)], [[False] * C for _ in range(B)]
    for i in range(B):
        live = [t for t in range(C) if mask[i][t] > 0]
        for t in live:
            log_r = old[i][t] - beh[i][t] if level == "token" else sum(old[i][s] - beh[i][s] for s in live) / len(live)
            r = math.exp(log_r)
            inside = low <= r <= clip
            w[i][t] = min(clip, max(low, r)) if mode == "truncate" else (r if inside else 0.0)
            out[i][t] = not inside
    return w, out


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("low", [0.0, 0.7])
def test_weights_match_the_brute_force_definition(level, mode, low):
    g = torch.Generator().manual_seed(3)
    shift = torch.tensor([[-0.9], [-0.2], [0.0], [0.3], [0.8]])  # rows' log-ratios: some rows' means leave [0.7, 1.6]
    old, beh = torch.randn(5, 7, generator=g) * 0.6 + shift, torch.randn(5, 7, generator=g) * 0.6
    mask = (torch.rand(5, 7, generator=g) > 0.3).float()
    w, out = behaviour_weights(old, beh, mask, level, 1.6, low, mode)
    want_w, want_out = _brute(old.tolist(), beh.tolist(), mask.tolist(), level, 1.6, low, mode)
    torch.testing.assert_close(w, torch.tensor(want_w), rtol=1e-5, atol=1e-6)
    assert out.tolist() == want_out and 0 < out.sum() < mask.sum()  # some ratios inside, some outside


def test_mask_composes_with_d3s_token_selection(backend):  # noqa: F811
    """Masked weights first, then D3S's selector (top 50% of tokens by |A| x entropy): the weights stay as computed."""
    batch, old = _random_batch(backend, 0.5, seed=1)
    mask = batch.loss_mask.clone()
    over = ["algorithm=d3s", "algorithm.correction=behaviour_is", "algorithm.correction_mode=mask", "algorithm.token_keep=0.5"]
    m = tokens.apply(batch, backend, check(compose(over)).algorithm, 0.0, distributed.SINGLE)
    w, _ = behaviour_weights(old, batch.sampler_logprobs, mask, "token", 2.0, 0.0, "mask")
    assert torch.allclose(batch.token_weights, w, atol=1e-6) and (w[mask > 0] == 0).any()
    assert 0 < batch.loss_mask.sum() < mask.sum() and m["tokens_kept_frac"] < 1.0


def _brute_gap(trainer, sampler, mask):
    d = [(trainer[i][t] - sampler[i][t], i) for i in range(len(mask)) for t in range(len(mask[0])) if mask[i][t] > 0]
    k3 = sum(math.exp(x) - 1 - x for x, _ in d) / len(d)
    rows = sorted({i for _, i in d})
    # the sampler's log-perplexity minus the trainer's, per row: mean(-log mu) - mean(-log pi) = mean(log pi - log mu)
    ppl = sum(sum(x for x, j in d if j == i) / sum(1 for _, j in d if j == i) for i in rows) / len(rows)
    return k3, ppl, sum(abs(x) for x, _ in d) / len(d), max(abs(x) for x, _ in d)


def test_mismatch_k3_and_log_ppl_gap_match_the_brute_force_over_micro_batches():
    g = torch.Generator().manual_seed(5)
    trainer, sampler = torch.randn(6, 5, generator=g) * 0.3 - 1, torch.randn(6, 5, generator=g) * 0.3 - 1
    mask = (torch.rand(6, 5, generator=g) > 0.4).float()
    mask[4] = 0.0  # a row without a loss token counts in neither mean
    acc = gap_sums(trainer[:2], sampler[:2], mask[:2])
    add_gap(acc, gap_sums(trainer[2:], sampler[2:], mask[2:]))  # two micro-batches add up to the whole batch
    torch.testing.assert_close(acc, gap_sums(trainer, sampler, mask))
    got = GapCheck("mismatch")(acc)
    k3, ppl, gap, top = _brute_gap(trainer.tolist(), sampler.tolist(), mask.tolist())
    assert got["mismatch_k3"] == pytest.approx(k3, rel=1e-6) and got["log_ppl_gap"] == pytest.approx(ppl, rel=1e-6)
    assert got["sampler_gap"] == pytest.approx(gap, rel=1e-6) and got["sampler_gap_max"] == pytest.approx(top, rel=1e-6)
    assert got["mismatch_k3"] > 0


def test_equal_log_probs_give_zero_mismatch():
    lp = torch.randn(3, 4)
    got = GapCheck()(gap_sums(lp, lp.clone(), torch.ones(3, 4)))
    assert got["mismatch_k3"] == 0.0 and got["log_ppl_gap"] == 0.0 and got["sampler_gap"] == 0.0


@pytest.mark.parametrize("correction,warned", [("none", True), ("behaviour_is", False), ("sparse_rl", False)])
def test_staleness_without_a_correction_warns_once(correction, warned, caplog):
    cfg = check(compose(["train.max_staleness=1", f"algorithm.correction={correction}"]))
    gap = GapCheck.of(cfg)
    with caplog.at_level(logging.WARNING, logger="pods"):
        for _ in range(3):
            gap(torch.zeros(6, dtype=torch.float64))
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == int(warned) and all("\n" not in x and "algorithm.correction=none" in x for x in lines)


def test_the_synchronous_loop_does_not_warn():
    assert GapCheck.of(check(compose(["train.max_staleness=0"]))).advice == ""


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["algorithm.correction=behaviour_is", "algorithm.correction_low=1.5"], r"algorithm\.correction_low must be <= 1"),
        (["algorithm.correction=behaviour_is", "algorithm.correction_low=-0.1"], r"algorithm\.correction_low"),
        (["algorithm.correction=behaviour_is", "algorithm.correction_mode=drop"], r"algorithm\.correction_mode"),
        (["algorithm.correction=[sparse_rl,behaviour_is]", "algorithm.correction_mode=mask"], r"use algorithm\.correction=sparse_rl"),
    ],
)
def test_invalid_settings_fail_in_one_line(overrides, match):
    from pods.config import validate

    with pytest.raises(ConfigError, match=match) as e:
        validate(compose(overrides))
    assert "\n" not in str(e.value)
