"""``algorithm.correction=behaviour_is`` (pods.behaviour_is): truncated importance weights against the sampler's
log-probs on hand-computed [B, C] batches (token and sequence level, masks), the rows' staleness, the composition with
Sparse-RL's weights and with D3S's token selection through ``pods.tokens.apply`` (real pre-pass on the tiny model),
weights of exactly 1 leaving the update bit for bit unchanged, and the one-line errors for invalid settings."""

from __future__ import annotations

import math

import pytest
import torch

from pods import distributed, tokens
from pods.backends.base import TokenStats, build_batch
from pods.behaviour_is import behaviour_is, behaviour_weights
from pods.errors import ConfigError
from pods.schema import Algorithm, check, complete
from pods.tokens import CORRECTIONS, StepContext
from support.config import ALGORITHM, compose

LOG = math.log


def close(got: torch.Tensor, want: list[list[float]]) -> None:
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-6)


def _batch(ratios: list[list[float]]):
    """Rows whose pi_old / sampler ratio per token is ``ratios`` (the sampler's log-probs fixed at log 0.5); the
    completion lengths are the rows' lengths, padded to the longest. Returns (batch, pi_old log-probs [B, C])."""
    comps = [[5] * len(r) for r in ratios]
    batch = build_batch([[1, 2]] * len(ratios), comps, [[LOG(0.5)] * len(r) for r in ratios], torch.ones(len(ratios)), pad_id=0)
    old = torch.zeros_like(batch.loss_mask)
    for i, r in enumerate(ratios):
        old[i, : len(r)] = torch.log(torch.tensor(r)) + LOG(0.5)
    return batch, old


def _ctx(old, **alg):
    return StepContext(
        alg=complete(Algorithm, ALGORITHM, correction="behaviour_is", **alg), progress=0.0, dist=distributed.SINGLE, stats=TokenStats(old)
    )


def test_token_level_hand_computed():
    # row 0: ratios 0.5, 3.0 (truncated at C = 2), 1.0 ; row 1 (2 tokens + padding): 1.9 (below C), 0.25
    batch, old = _batch([[0.5, 3.0, 1.0], [1.9, 0.25]])
    m = behaviour_is(batch, _ctx(old))
    close(batch.token_weights, [[0.5, 2.0, 1.0], [1.9, 0.25, 0.0]])
    assert batch.loss_mask.tolist() == [[1, 1, 1], [1, 1, 0]]  # weights only: no token masked
    assert m["bis_weight_mean"] == pytest.approx((0.5 + 2 + 1 + 1.9 + 0.25) / 5)
    assert m["bis_weight_max"] == pytest.approx(2.0)
    assert m["bis_clipped_frac"] == pytest.approx(1 / 5)
    assert m["staleness_mean"] == 0.0 and m["staleness_max"] == 0.0  # no batch.staleness: the synchronous loop


def test_sequence_level_is_the_truncated_geometric_mean_over_the_loss_tokens():
    # row 0: (0.5 * 2 * 4)^(1/3) = 4^(1/3) ; row 1: (4 * 4)^(1/2) = 4 -> 3 (C = 3) ; row 2: its third token is out of
    # the loss (a selector's mask), so (2 * 8)^(1/2) = 4 -> 3 ; row 3: no token in the loss -> 0
    batch, old = _batch([[0.5, 2.0, 4.0], [4.0, 4.0], [2.0, 8.0, 100.0], [1.0]])
    batch.loss_mask[2, 2] = 0.0
    batch.loss_mask[3] = 0.0
    m = behaviour_is(batch, _ctx(old, correction_level="sequence", correction_clip=3.0))
    c = 4 ** (1 / 3)
    want = [[c, c, c], [3.0, 3.0, 0.0], [3.0, 3.0, 0.0], [0.0, 0.0, 0.0]]
    close(batch.token_weights, want)
    assert m["bis_clipped_frac"] == pytest.approx(4 / 7)  # rows 1 and 2 truncated: 4 of the 7 loss tokens
    assert m["bis_weight_mean"] == pytest.approx((3 * c + 12) / 7) and m["bis_weight_max"] == pytest.approx(3.0)


def test_weights_multiply_what_an_earlier_correction_left():
    batch, old = _batch([[0.5, 3.0]])
    batch.token_weights = torch.tensor([[2.0, 0.5]])
    behaviour_is(batch, _ctx(old))
    close(batch.token_weights, [[1.0, 1.0]])


def test_staleness_of_the_rows_is_logged():
    batch, old = _batch([[1.0], [1.0], [1.0]])
    batch.staleness = torch.tensor([0, 1, 2])
    m = behaviour_is(batch, _ctx(old))
    assert m["staleness_mean"] == pytest.approx(1.0) and m["staleness_max"] == 2.0


def test_direct_function_matches_the_formula_on_random_batches():
    g = torch.Generator().manual_seed(0)
    old, beh = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    w, cut = behaviour_weights(old, beh, mask, "token", 1.5)
    assert torch.equal(w, torch.minimum(torch.exp(old - beh), torch.tensor(1.5)) * mask)
    assert torch.equal(cut, (torch.exp(old - beh) > 1.5) & (mask > 0))


def test_registered_with_a_stats_request():
    assert CORRECTIONS.get("behaviour_is") is behaviour_is and CORRECTIONS.spec("behaviour_is").needs_stats


@pytest.fixture(scope="module")
def backend(tiny_dir):
    from pods.backends.local import LocalBackend

    return LocalBackend(str(tiny_dir), check(compose(["algorithm=d3s"])))


def _random_batch(backend, shift: float, seed: int = 0):
    """8 rows of the tiny model's vocabulary; the sampler's log-probs = the pre-pass's + ``shift`` x noise."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, 290, (int(k),), generator=g).tolist() for k in torch.randint(3, 9, (8,), generator=g)]
    comps = [torch.randint(10, 290, (int(k),), generator=g).tolist() for k in torch.randint(2, 13, (8,), generator=g)]
    batch = build_batch(prompts, comps, [[0.0] * len(c) for c in comps], torch.randn(8, generator=g), 0)
    old = backend.policy_stats(batch).logprobs
    batch.sampler_logprobs = (old + shift * torch.randn(old.shape, generator=g)) * batch.loss_mask
    return batch, old


def test_composes_with_d3s_token_selection(backend):
    """The correction weighs, then D3S's selector masks (top 50% of tokens by |A| x entropy): the weights stay."""
    batch, old = _random_batch(backend, 0.5, seed=1)
    mask = batch.loss_mask.clone()
    alg = check(compose(["algorithm=d3s", "algorithm.correction=behaviour_is", "algorithm.token_keep=0.5"])).algorithm
    m = tokens.apply(batch, backend, alg, 0.0, distributed.SINGLE)
    w, _ = behaviour_weights(old, batch.sampler_logprobs, mask, "token", 2.0)
    assert torch.allclose(batch.token_weights, w, atol=1e-6)
    assert 0 < batch.loss_mask.sum() < mask.sum() and m["tokens_kept_frac"] < 1.0 and m["bis_clipped_frac"] > 0


def test_weights_of_exactly_one_leave_the_update_bit_for_bit(tiny_dir):
    """Sampler log-probs equal to the pre-pass's (staleness 0, the same numerics): w = min(C, e^0) = 1 on every token,
    and the update (loss, grad norm, the weights after one AdamW step) equals the uncorrected one bit for bit."""
    from pods.backends.local import LocalBackend

    out = {}
    for corr in ("none", "behaviour_is"):
        cfg = check(compose(["algorithm=grpo", f"algorithm.correction={corr}", "hardware.micro_batch_size=3"]))
        torch.manual_seed(0)
        b = LocalBackend(str(tiny_dir), cfg)
        batch, old = _random_batch(b, 0.0)
        batch.old_logprobs = old  # what the pre-pass gives the uncorrected run too (one optimizer step: same ratio)
        m = tokens.apply(batch, b, cfg.algorithm, 0.0, distributed.SINGLE)
        stats = b.update(batch, lr=1e-3)
        out[corr] = (stats["loss"], stats["grad_norm"], [p.detach().clone() for p in b.model.parameters()], m)
    assert out["behaviour_is"][3]["bis_weight_mean"] == 1.0 and out["behaviour_is"][3]["bis_clipped_frac"] == 0.0
    assert out["none"][:2] == out["behaviour_is"][:2]
    assert all(torch.equal(a, b) for a, b in zip(out["none"][2], out["behaviour_is"][2]))


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["algorithm.correction=behaviour_is", "algorithm.correction_clip=0.5"], r"algorithm\.correction_clip must be >= 1"),
        (["algorithm.correction=behaviour_is", "algorithm.correction_level=row"], r"algorithm\.correction_level"),
        (["algorithm.correction=[none,behaviour_is]"], r"'none' cannot be combined"),
        (["algorithm.correction=[behaviour_is,behaviour_is]"], r"lists a name twice"),
        (["algorithm.correction=[sparse_rl,behaviour_iss]"], r"algorithm\.correction"),
        (["algorithm.correction=[sparse_rl,behaviour_is]"], r"twice.*use algorithm\.correction=sparse_rl"),  # both weight by pi_old/mu
        (["algorithm.correction=behaviour_is", "train.old_logprobs=sampler"], r"count it twice"),
        (["algorithm.correction=behaviour_is", "rollout=vllm", "sampling.top_k=50"], r"sampling\.top_k=50.*correction=behaviour_is"),
    ],
)
def test_invalid_settings_fail_in_one_line(overrides, match):
    from pods.config import validate

    with pytest.raises(ConfigError, match=match) as e:
        validate(compose(overrides))
    assert "\n" not in str(e.value)
