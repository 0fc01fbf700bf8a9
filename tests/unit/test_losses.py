"""Hand-computed values for the loss pieces, advantages and schedules."""

import math

import pytest
import torch

from pods.advantages import ADVANTAGES
from pods.losses import AGGREGATIONS, POLICY_LOSSES, k3_kl, token_logprobs
from pods.schedules import SCHEDULES
from pods.schema import Algorithm, complete
from support.config import ALGORITHM
from support.harness import max_gap, within


def test_clipped_surrogate_matches_hand_values():
    # per token: (log-ratio, advantage) -> expected loss, clipped?
    cases = [
        (0.5, 1.0, -1.2, True),
        (0.5, -1.0, math.exp(0.5), False),
        (math.log(0.5), 1.0, -0.5, False),
        (math.log(0.5), -1.0, 0.8, True),
        (0.0, 2.0, -2.0, False),
    ]
    old = torch.zeros(len(cases), 1)
    logp = torch.tensor([[c[0]] for c in cases])
    adv = torch.tensor([c[1] for c in cases])
    loss, clipped = POLICY_LOSSES.get("clipped")(logp, old, adv, 0.2, 0.2)
    assert torch.allclose(loss.squeeze(1), torch.tensor([c[2] for c in cases]), atol=1e-6)
    assert clipped.squeeze(1).tolist() == [c[3] for c in cases]


def test_asymmetric_clip_uses_eps_high_above_one():
    loss, _ = POLICY_LOSSES.get("clipped")(torch.tensor([[0.5]]), torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.28)


def test_gradient_of_clipped_token_is_zero_and_unclipped_is_ratio_times_adv():
    logp = torch.tensor([[0.5, 0.1]], requires_grad=True)
    loss, _ = POLICY_LOSSES.get("clipped")(logp, torch.zeros(1, 2), torch.tensor([1.0]), 0.2, 0.2)
    loss.sum().backward()
    assert logp.grad[0, 0].item() == 0.0  # ratio e^0.5 > 1.2: clipped, no gradient
    assert logp.grad[0, 1].item() == pytest.approx(-math.exp(0.1))


def test_k3_kl_hand_value_and_zero_at_equality():
    kl = k3_kl(torch.tensor([math.log(0.5), -1.0]), torch.tensor([math.log(0.25), -1.0]))
    assert kl[0].item() == pytest.approx(0.5 - math.log(0.5) - 1)
    assert kl[1].item() == 0.0


def test_aggregations_hand_values():
    per_tok = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert AGGREGATIONS.get("seq_mean")(per_tok, mask, 2, 3).item() == pytest.approx((2.0 + 2.0) / 2)
    assert AGGREGATIONS.get("token_mean")(per_tok, mask, 2, 3).item() == pytest.approx(6.0 / 3)


def test_token_logprobs_divides_by_temperature():
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    lp = token_logprobs(logits, torch.tensor([[0]]), temperature=0.5)
    expected = 4.0 - math.log(math.exp(4.0) + 1 + math.exp(-2.0))
    assert lp.item() == pytest.approx(expected, rel=1e-5)


def test_grpo_advantage_hand_value_and_constant_row():
    adv = ADVANTAGES.get("grpo")(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.3, 0.3, 0.3, 0.3]]))
    s = math.sqrt(1 / 3)
    assert torch.allclose(adv[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (s + 1e-4))
    assert torch.equal(adv[1], torch.zeros(4))


@pytest.mark.parametrize("name", ["constant", "cosine", "linear"])
def test_schedules_depend_only_on_progress(name):
    f = SCHEDULES.get(name)
    assert f(0.05, 0.1) == pytest.approx(0.5)  # warmup halfway
    assert f(0.1, 0.1) == pytest.approx(1.0)
    end = {"constant": 1.0, "cosine": 0.0, "linear": 0.0}[name]
    assert f(1.0, 0.1) == pytest.approx(end, abs=1e-9)


def _head_and_hidden(seed=0, B=3, T=5, H=8, V=11):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    hidden = torch.randn(B, T, H, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (B, T), generator=g)
    return head, hidden, targets


@pytest.mark.parametrize("chunk", [1, 4, 7, 15, None])
def test_chunked_token_stats_equal_the_full_logits_path_values_and_gradients(chunk):
    from pods.losses import chunked_token_stats, token_entropy

    head, hidden, targets = _head_and_hidden()
    logits = head(hidden)
    ref_lp, ref_ent = token_logprobs(logits, targets, 0.7), token_entropy(logits, 0.7)
    ref_lp.sum().backward()
    ref_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    lp, ent = chunked_token_stats(head, hidden, targets, 0.7, chunk_tokens=chunk, entropy=True)
    lp.sum().backward()
    # 1e-5: chunking changes the matmul's blocking; measured max 1.9e-6 (log-probs) and 2.4e-6 (gradients, DEFAULT kernels)
    # over the chunk sizes under DEFAULT/AVX2/AVX-512 (make test-isa, docs/numerics.md), about float32 eps x |logit| x 10
    within(max(max_gap(lp, ref_lp), max_gap(ent, ref_ent)), 1e-5, f"chunked head ({chunk} rows) vs full logits")
    assert not ent.requires_grad
    grad_gap = max(max_gap(hidden.grad, ref_grads[0]), max_gap(head.weight.grad, ref_grads[1]))
    within(grad_gap, 1e-5, f"chunked head ({chunk} rows) vs full logits, gradients")


def test_token_entropy_hand_values():
    from pods.losses import token_entropy

    uniform = torch.zeros(1, 1, 4)
    assert token_entropy(uniform).item() == pytest.approx(math.log(4))
    peaked = torch.tensor([[[100.0, 0.0, 0.0]]])
    assert token_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)


def _bnpo_loss(per_tok, mask, group, n_groups=None):
    from pods.losses import bnpo_scale

    n_groups = n_groups if n_groups is not None else torch.unique(group).numel()
    scaled = per_tok * bnpo_scale(group, mask, n_groups).unsqueeze(1)
    return AGGREGATIONS.get("bnpo")(scaled, mask, len(group), int(mask.sum()))


def test_bnpo_seq_mean_token_mean_differ_on_a_hand_example():
    """Group 0: row A (2 tokens of loss 1), row B (1 token of loss 4); group 1: row C (1 token of loss 3).
    seq_mean = (1 + 4 + 3) / 3 = 8/3; token_mean = (1 + 1 + 4 + 3) / 4 = 9/4;
    bnpo = mean over groups of the group's token mean = ((1 + 1 + 4) / 3 + 3 / 1) / 2 = 5/2."""
    per_tok = torch.tensor([[1.0, 1.0], [4.0, 9.0], [3.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    group = torch.tensor([0, 0, 1])
    assert AGGREGATIONS.get("seq_mean")(per_tok, mask, 3, 4).item() == pytest.approx(8 / 3)
    assert AGGREGATIONS.get("token_mean")(per_tok, mask, 3, 4).item() == pytest.approx(9 / 4)
    assert _bnpo_loss(per_tok, mask, group).item() == pytest.approx(5 / 2)
    # over ranks: 2 groups here, 4 groups in all on 2 ranks -> the same per-rank factor (DeepSpeed averages)
    assert _bnpo_loss(per_tok, mask, group, n_groups=2.0).item() == pytest.approx(5 / 2)


class _LinearPolicy:
    """A real differentiable policy for Backend.update: log p = theta * (token feature), one parameter; the reference
    policy's log-probs are 0 (the KL term's)."""

    def __init__(self, **alg):
        from pods.backends.base import Updater

        class B(Updater):  # the update's hooks only (no model, no plug-in)
            def __init__(s):
                s.alg = complete(Algorithm, ALGORITHM, **{"policy_loss": "clipped", "loss_agg": "bnpo", "epsilon": 0.2, "beta": 0.0, **alg})
                s.micro_batch_size = 1
                s.temperature = 1.0
                s.theta = torch.tensor(0.3, requires_grad=True)

            def forward_logprobs(s, mb):
                return s.theta * mb.sampler_logprobs

            def ref_logprobs(s, mb):
                return torch.zeros_like(mb.sampler_logprobs)

            def backward(s, loss):
                loss.backward()

            def optimizer_step(s, lr):
                g = float(s.theta.grad)
                s.theta.grad = None
                return g

        self.backend = B()


@pytest.mark.parametrize("mbs", [1, 2, 3, 5])
def test_bnpo_is_exact_under_gradient_accumulation(mbs):
    """Backend.update with micro-batches of 1, 2, 3 or 5 rows (groups split across micro-batches) gives the
    same loss and gradient as one batch, and equals the formula on the whole batch."""
    from pods.backends.base import TrainBatch

    gen = torch.Generator().manual_seed(0)
    lens = [3, 1, 2, 4, 2]
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in lens])
    feats = -torch.rand(5, 4, generator=gen) * mask
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0])

    def run(size):
        pol = _LinearPolicy().backend
        batch = TrainBatch(
            torch.zeros(5, 6, dtype=torch.long), torch.ones(5, 6), 2, mask.clone(), adv, feats, group=torch.tensor([0, 0, 1, 1, 2])
        )
        out = pol.update(batch, lr=0.0, micro_batch_size=size)
        return out["loss"], out["grad_norm"]

    whole, many = run(5), run(mbs)
    assert many[0] == pytest.approx(whole[0], rel=1e-6) and many[1] == pytest.approx(whole[1], rel=1e-6)
    # the whole-batch value by hand: ratio = 1 at old = current, so the loss per token is -A
    per_group = [(-(1.0 * 3) + 1.0 * 1) / 4, (-(0.5 * 2) + 0.5 * 4) / 6, -2.0 * 2 / 2]
    assert whole[0] == pytest.approx(sum(per_group) / 3, rel=1e-6)


def test_loss_temperature_option():
    """algorithm.loss_temperature: 'sampling' divides the logits by the sampling T; 1.0 = the raw logits
    (the authors' TRL 0.14 loss); anything else is a one-line config error."""
    from pods.backends.base import loss_temperature
    from pods.config import ConfigError, validate
    from support.config import compose

    cfg = validate(compose(["sampling.temperature=0.9"]))
    assert loss_temperature(cfg) == pytest.approx(0.9)
    cfg = validate(compose(["sampling.temperature=0.9", "algorithm.loss_temperature=1.0"]))
    assert loss_temperature(cfg) == 1.0 and loss_temperature(cfg.algorithm, cfg.sampling) == 1.0
    with pytest.raises(ConfigError, match="algorithm.loss_temperature"):
        validate(compose(["algorithm.loss_temperature=hot"]))


# ---- GSPO (arXiv 2507.18071) ---------------------------------------------------------------------------------
def _gspo_case():
    """Row 0: token log-ratios 0.1, 0.3 (both in the loss), A = +1; row 1: -0.1 in the loss, then 0.5 out of it (a
    dropped token) and padding, A = -2."""
    logp = torch.tensor([[0.1, 0.3, 0.0], [-0.1, 0.5, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    return logp, torch.zeros(2, 3), torch.tensor([1.0, -2.0]), mask


def test_gspo_sequence_ratio_and_clip_hand_values():
    """s_0 = exp((0.1 + 0.3) / 2) = e^0.2 = 1.2214 > 1.2: clipped, loss -1.2 on each of its tokens;
    s_1 = e^-0.1 = 0.9048 (the dropped token's 0.5 does not enter), loss -(0.9048 x -2) = 1.8097, not clipped."""
    logp, old, adv, mask = _gspo_case()
    loss, clipped = POLICY_LOSSES.get("gspo")(logp, old, adv, 0.2, 0.2, mask=mask)
    assert torch.allclose(loss, torch.tensor([[-1.2] * 3, [2 * math.exp(-0.1)] * 3]), atol=1e-6)
    assert clipped.tolist() == [[True] * 3, [False] * 3]
    # the paper's ranges (3e-4, 4e-4): both sequences are clipped, to 1 + 4e-4 and 1 - 3e-4
    loss, clipped = POLICY_LOSSES.get("gspo")(logp, old, adv, 3e-4, 4e-4, mask=mask)
    assert loss[0, 0].item() == pytest.approx(-(1 + 4e-4)) and loss[1, 0].item() == pytest.approx(2 * (1 - 3e-4))
    assert clipped[:, 0].tolist() == [True, True]  # row 1: s below the range with A < 0: min picks (1 - 3e-4) x A


def test_gspo_gradient_is_the_sequence_ratio_times_the_mean_token_gradient():
    """seq_mean over the 2 sequences: row 0 is clipped (no gradient); row 1's loss -A s_1 has gradient
    -A s_1 / |y_1| = 2 e^-0.1 / 1 on its one kept token, halved by the mean over 2 sequences; 0 elsewhere."""
    logp, old, adv, mask = _gspo_case()
    loss, _ = POLICY_LOSSES.get("gspo")(logp, old, adv, 0.2, 0.2, mask=mask)
    AGGREGATIONS.get("seq_mean")(loss, mask, 2, 3).backward()
    expected = torch.zeros(2, 3)
    expected[1, 0] = 2 * math.exp(-0.1) / 2
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_gspo_token_has_gspo_values_and_gradients_with_one_advantage_per_sequence():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    old = torch.randn(4, 6, generator=g) * 0.1
    base = old + torch.randn(4, 6, generator=g) * 0.1
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0])
    grads, values = [], []
    for name in ("gspo", "gspo_token"):
        logp = base.clone().requires_grad_(True)
        loss, clipped = POLICY_LOSSES.get(name)(logp, old, adv, 0.01, 0.015, mask=mask)
        AGGREGATIONS.get("seq_mean")(loss, mask, 4, int(mask.sum())).backward()
        grads.append(logp.grad)
        values.append((loss * mask, clipped & (mask > 0)))
    within(max_gap(values[0][0], values[1][0]), 1e-6, "gspo vs gspo_token loss")
    assert torch.equal(values[0][1], values[1][1])
    within(max_gap(grads[0], grads[1]), 1e-7, "gspo vs gspo_token gradient")
    assert values[0][1].any() and not values[0][1].all()  # some sequences clipped, some not: both branches tested


def test_gspo_needs_the_mask():
    logp, old, adv, _ = _gspo_case()
    with pytest.raises(ValueError, match="mask"):
        POLICY_LOSSES.get("gspo")(logp, old, adv, 0.2, 0.2)


def _linear_batch(old_shift: float = 0.0):
    """5 rows of 1-4 loss tokens with features in (-1, 0]; old log-probs = the current ones + ``old_shift`` x row."""
    from pods.backends.base import TrainBatch

    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in [3, 1, 2, 4, 2]])
    feats = -torch.rand(5, 4, generator=gen) * mask
    batch = TrainBatch(torch.zeros(5, 6, dtype=torch.long), torch.ones(5, 6), 2, mask, torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0]), feats)
    batch.old_logprobs = (0.3 * feats + old_shift * torch.arange(5.0).unsqueeze(1) * 0.01) * mask
    return batch


@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
@pytest.mark.parametrize("mbs", [1, 2, 3])
def test_gspo_is_exact_under_gradient_accumulation(name, mbs):
    """Backend.update with GSPO (old log-probs off the current ones, so ratios differ from 1 and some sequences clip)
    gives the one-batch loss and gradient in micro-batches of 1, 2 or 3 rows, and the loss is GSPO's formula."""
    runs = {}
    for size in (5, mbs):
        pol = _LinearPolicy(policy_loss=name, loss_agg="seq_mean", epsilon=0.003, epsilon_high=0.004).backend
        out = pol.update(_linear_batch(old_shift=1.0), lr=0.0, micro_batch_size=size)
        runs[size] = (out["loss"], out["grad_norm"], out["clip_frac"])
    assert runs[mbs][0] == pytest.approx(runs[5][0], rel=1e-6) and runs[mbs][1] == pytest.approx(runs[5][1], rel=1e-6)
    assert 0 < runs[5][2] < 1  # some sequences clipped, some not
    b = _linear_batch(old_shift=1.0)
    log_s = ((0.3 * b.sampler_logprobs - b.old_logprobs) * b.loss_mask).sum(1) / b.loss_mask.sum(1)
    s = torch.exp(log_s)
    per_seq = -torch.minimum(s * b.advantages, s.clamp(1 - 0.003, 1 + 0.004) * b.advantages)
    assert runs[5][0] == pytest.approx(float(per_seq.mean()), rel=1e-6)


@pytest.mark.parametrize("weighted", [True, False])
def test_kl_weighting_and_clamp_hand_values(weighted):
    """beta 0.5, k3 clamped to 10, token weights w: per token pg w + beta kl (kl_weighted false: Sparse-RL's
    release) or (pg + beta kl) w; the ratio is 1 (old = current), so pg = -A. A token with logp = -12 has
    k3 = e^12 - 13 > 10: clamped, so its KL adds 0.5 x 10 and no gradient."""
    b = _linear_batch()
    b.sampler_logprobs[3, 0] = -40.0  # logp = 0.3 x -40 = -12
    b.old_logprobs = None
    w = torch.linspace(0.5, 1.5, 20).view(5, 4) * b.loss_mask
    b.token_weights = w
    pol = _LinearPolicy(loss_agg="seq_mean", beta=0.5, kl_clamp=10.0, kl_weighted=weighted).backend
    out = pol.update(b, lr=0.0)
    logp = 0.3 * b.sampler_logprobs
    kl = (torch.exp(-logp) + logp - 1).clamp(-10, 10)
    pg = -b.advantages.unsqueeze(1).expand(5, 4)
    per_tok = (pg + 0.5 * kl) * w if weighted else pg * w + 0.5 * kl
    expected = ((per_tok * b.loss_mask).sum(1) / b.loss_mask.sum(1)).mean()
    assert out["loss"] == pytest.approx(float(expected), rel=1e-6)
    assert kl[3, 0] == 10.0


def test_per_micro_batch_weight_normaliser_hand_values():
    """``weight_norm_mask`` set (Sparse-RL's ``norm_scope: micro_batch``): each micro-batch divides the weights by
    their mean over that mask in it, so with one row per micro-batch every row's weights average 1 over its mask
    (the released per-call normaliser), and the loss differs from the one-batch normalisation."""
    losses = {}
    for size in (5, 1):
        b = _linear_batch()
        b.old_logprobs = None
        b.token_weights = torch.linspace(0.5, 1.5, 20).view(5, 4) * b.loss_mask
        b.weight_norm_mask = b.loss_mask.clone()
        pol = _LinearPolicy(loss_agg="seq_mean").backend
        losses[size] = pol.update(b, lr=0.0, micro_batch_size=size)["loss"]
    b = _linear_batch()
    w = torch.linspace(0.5, 1.5, 20).view(5, 4) * b.loss_mask
    m, pg = b.loss_mask, -b.advantages.unsqueeze(1)
    per_row = [(pg[i] * w[i] / ((w[i] * m[i]).sum() / m[i].sum()) * m[i]).sum() / m[i].sum() for i in range(5)]
    assert losses[1] == pytest.approx(float(sum(per_row) / 5), rel=1e-6)
    whole = (pg * w / ((w * m).sum() / m.sum()) * m).sum(1) / m.sum(1)
    assert losses[5] == pytest.approx(float(whole.mean()), rel=1e-6) and losses[5] != pytest.approx(losses[1], rel=1e-3)
