"""Per-token policy losses and how they are aggregated, each registered by name.

Shapes: B sequences, T completion positions. ``mask`` [B, T] marks tokens that enter the loss (completion
tokens, possibly thinned by a token-level selector); ``weights`` [B, T] multiplies per-token losses.
Aggregators take the normalisers of the WHOLE optimizer-step batch, so splitting it into micro-batches
with gradient accumulation yields exactly the big-batch gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pods.registry import Registry


@dataclass(frozen=True)
class AggSpec:
    """What a loss aggregation needs of the update (registered with it: ``AGGREGATIONS.spec(name)``)."""

    prepare: Callable | None = None  # ``prepare(batch, backend)`` before each optimizer step's micro-batches (its normalisers)
    whole_groups: bool = False  # it normalises per prompt group: a mini-batch must not split a group


POLICY_LOSSES = Registry("policy loss")
AGGREGATIONS = Registry("loss aggregation", spec=AggSpec)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature). logits [B, T, V], targets [B, T] -> [B, T]."""
    logits = logits.float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) over the whole vocabulary, in nats. [B, T, V] -> [B, T].

    H = logsumexp(z) - sum_v softmax(z)_v z_v with z = logits / temperature (no log of a zero probability).
    """
    z = logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    return lse - (torch.softmax(z, dim=-1) * z).sum(-1)


def _head_chunk(project, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool):
    """One chunk of rows: hidden [N, H], targets [N] -> (logp [N], entropy [N] or an empty tensor)."""
    z = project(hidden).float() / temperature  # [N, V]: the only vocabulary-sized tensors live here
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not entropy:
        return logp, logp.new_empty(0)
    with torch.no_grad():  # the entropy selects tokens; it is never differentiated
        ent = lse.detach() - (torch.softmax(z.detach(), dim=-1) * z.detach()).sum(-1)
    return logp, ent


def _chunk_loop(project, flat_h: torch.Tensor, flat_y: torch.Tensor, temperature: float, size: int, entropy: bool):
    """``_head_chunk`` over ``size`` rows at a time (checkpointed under grad when there are several chunks)."""
    from torch.utils.checkpoint import checkpoint

    n = flat_h.shape[0]
    grad = torch.is_grad_enabled() and flat_h.requires_grad and size < n
    lps, ents = [], []
    for start in range(0, n, max(size, 1)):
        args = (project, flat_h[start : start + size], flat_y[start : start + size], temperature, entropy)
        lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False) if grad else _head_chunk(*args)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), torch.cat(ents)


def chunked_token_stats(
    head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, chunk_tokens: int | None = None, entropy: bool = False
):
    """Token log-probs (and entropies) from the final hidden states without materialising [B, T, V] logits.

    head: the output projection (``lm_head``); hidden [B, T, H] (after the final norm), targets [B, T]. Rows are
    processed ``chunk_tokens`` at a time; with grad enabled each chunk is checkpointed, so forward AND backward hold
    at most one chunk of fp32 logits (chunk_tokens x V x 4 bytes, plus softmax/grad copies of that size) instead of
    B x T x V. ``chunk_tokens`` None or 0 = one chunk (equal to the unchunked computation).

    The head MODULE is called once for all chunks (its own forward runs per chunk inside that call, and again in each
    chunk's recompute): module hooks run once, so DeepSpeed ZeRO-3 gathers the partitioned head weight once for the
    whole loop in the forward and once in the backward, whatever the number of chunks, and the module order it traces
    does not depend on the number of chunks (tests/distributed/test_deepspeed_chunks_on_cpu.py; docs/memory.md).
    Returns (logp [B, T] float32, entropy [B, T] float32 without grad, or None).
    """
    B, T, H = hidden.shape
    size = int(chunk_tokens) if chunk_tokens else B * T
    own = head.__dict__.get("forward")  # a forward installed on the instance (accelerate's hooks), kept as the projection
    project = head.forward

    def all_chunks(flat_h, flat_y):
        return _chunk_loop(project, flat_h, flat_y, temperature, size, entropy)

    head.forward = all_chunks  # this call's forward only: __call__ runs the module's hooks around the whole loop
    try:
        logp, ent = head(hidden.reshape(B * T, H), targets.reshape(B * T))
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
    return logp.view(B, T), (ent.view(B, T) if entropy else None)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None = None) -> torch.Tensor:
    """The k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0. [B, T] -> [B, T].

    ``clamp``: the estimate clamped to [-clamp, clamp] (slime's ``low_var_kl``, which Sparse-RL's release uses with
    10; a clamped token has no gradient); None = unclamped."""
    d = ref_logp - logp
    kl = torch.exp(d) - d - 1
    return kl if clamp is None else kl.clamp(-clamp, clamp)


# A policy loss: ``fn(logp, old_logp, advantages, eps_low, eps_high, mask=None) -> (loss [B, T], clipped [B, T] bool)``,
# ``logp``/``old_logp`` [B, T] (with/without grad), ``advantages`` [B], ``mask`` [B, T] the tokens in the loss (the
# backend passes ``batch.loss_mask``; a token-level loss ignores it). The aggregation then reduces ``loss`` over ``mask``.
@POLICY_LOSSES.register("clipped")
def clipped_surrogate(logp, old_logp, advantages, eps_low: float, eps_high: float, mask=None):
    """PPO clipped surrogate, negated for minimisation.

    logp, old_logp: [B, T]; advantages: [B] (one per sequence). Returns (loss [B, T], clipped [B, T] bool):
    loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), ratio = exp(logp - old_logp).
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    unclipped, clipped = ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def sequence_log_ratio(logp, old_logp, mask):
    """log s_i = mean over the tokens in the loss of (logp - old_logp): [B, T] x3 -> [B]. A sequence with no token in
    the loss has log s_i = 0 (s_i = 1; it contributes nothing, its mask being all zero)."""
    m = mask.to(logp.dtype)
    return ((logp - old_logp) * m).sum(1) / m.sum(1).clamp(min=1)


@POLICY_LOSSES.register("gspo")
def gspo(logp, old_logp, advantages, eps_low: float, eps_high: float, mask=None):
    """GSPO (Zheng et al., arXiv 2507.18071): importance ratio and clipping per SEQUENCE, negated for minimisation.

    logp, old_logp: [B, T]; advantages: [B] (the group advantage A_i); mask: [B, T] the tokens in the loss. With
    s_i = exp(mean_{t in mask_i} (logp_i,t - old_logp_i,t)) (the length-normalised geometric mean of the token
    ratios), every token of sequence i carries loss_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), so
    ``seq_mean`` gives the paper's objective -(1/G) sum_i min(...) and its gradient -(1/G) sum_i A_i s_i mean_t
    grad logp_i,t on unclipped sequences. The paper's ranges are eps_low 3e-4, eps_high 4e-4. Returns (loss [B, T],
    clipped [B, T] bool, the sequence's decision on each of its tokens).

    Composition: the mask is the one the loss reduces over, so a token selector (D3S's top K by |A| x H) or a
    correction's rejection (Sparse-RL) enters the sequence ratio: s_i is the geometric mean over the KEPT tokens
    only; a token weight w_t (Sparse-RL) multiplies loss_i on token t, so under ``seq_mean`` sequence i counts with
    the mean of its kept tokens' weights.
    """
    if mask is None:
        raise ValueError("policy loss 'gspo' needs the loss mask (its sequence ratio averages over the tokens in the loss)")
    s = torch.exp(sequence_log_ratio(logp, old_logp, mask))  # [B]
    unclipped, clipped = s * advantages, torch.clamp(s, 1 - eps_low, 1 + eps_high) * advantages
    loss, hit = -torch.minimum(unclipped, clipped), clipped < unclipped
    return loss.unsqueeze(1).expand_as(logp), hit.unsqueeze(1).expand_as(logp)


@POLICY_LOSSES.register("gspo_token")
def gspo_token(logp, old_logp, advantages, eps_low: float, eps_high: float, mask=None):
    """GSPO-token (arXiv 2507.18071): s_i,t = sg[s_i] x pi(y_t) / sg[pi(y_t)], clipped as GSPO, per token.

    Its value on every token is s_i (the clipping decision is GSPO's) and its gradient on token t is s_i grad logp_i,t,
    so with one advantage per sequence (here) ``seq_mean`` gives GSPO's loss and gradient; it differs from GSPO only
    with per-token advantages. Shapes and ``mask`` as ``gspo``.
    """
    if mask is None:
        raise ValueError("policy loss 'gspo_token' needs the loss mask (its sequence ratio averages over the tokens in the loss)")
    s = torch.exp(sequence_log_ratio(logp, old_logp, mask)).detach().unsqueeze(1)  # [B, 1], no gradient
    ratio = s * torch.exp(logp - logp.detach())  # [B, T]: value s_i, gradient s_i d logp
    adv = advantages.unsqueeze(1)
    unclipped, clipped = ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    return -torch.minimum(unclipped, clipped), clipped < unclipped


@AGGREGATIONS.register("seq_mean")
def seq_mean(per_token, mask, n_seqs: int, n_tokens: int):
    """Mean over each sequence's tokens, then mean over the n_seqs sequences of the step (GRPO's)."""
    per_seq = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
    return per_seq.sum() / n_seqs


@AGGREGATIONS.register("token_mean")
def token_mean(per_token, mask, n_seqs: int, n_tokens: int):
    """Mean over all n_tokens loss tokens of the step (DAPO-style), so long answers weigh more."""
    return (per_token * mask).sum() / max(n_tokens, 1)


def bnpo(per_token, mask, n_seqs: int, n_tokens: int):
    """TRL 0.17's default: a token mean within each training unit, then an equal-weight mean over units and
    ranks. Here the unit is the paper's (one kept prompt group of m rows), not a hardware micro-batch, so the
    loss does not depend on ``hardware.micro_batch_size``. ``per_token`` [B, T] must already carry the
    per-row factor 1 / (loss tokens of the row's group x groups per rank) from ``bnpo_scale``; this sums it."""
    return (per_token * mask).sum()


def bnpo_scale(group: torch.Tensor, mask: torch.Tensor, n_groups: float) -> torch.Tensor:
    """Per-row factor of ``bnpo``: 1 / (N_g * n_groups) for row r of group g, where N_g = loss tokens of
    group g over the whole step and n_groups = groups per rank (the all-rank total / world size).
    group [B] long, mask [B, T] -> [B]."""
    _, inv = torch.unique(group, return_inverse=True)
    per_group = torch.zeros(int(inv.max()) + 1, dtype=mask.dtype).index_add_(0, inv, mask.sum(1))
    return 1.0 / (per_group[inv].clamp(min=1) * max(n_groups, 1e-12))


def _bnpo_prepare(batch, backend) -> None:
    """Set ``batch.agg_weights`` to ``bnpo_scale`` before the micro-batches of an optimizer step (exact under
    accumulation); ``batch``: that step's rows."""
    group = batch.group if batch.group is not None else torch.arange(len(batch))
    n_groups, _ = backend.step_totals(int(torch.unique(group).numel()), 0)
    batch.agg_weights = bnpo_scale(group, batch.loss_mask, n_groups).unsqueeze(1)


AGGREGATIONS.register("bnpo", bnpo, spec=AggSpec(prepare=_bnpo_prepare, whole_groups=True))


def seq_mean_token_sum_norm(per_token, mask, n_seqs: int, n_tokens: int):
    """Dr. GRPO (Liu et al., arXiv 2503.20783): each sequence's token SUM, divided by a constant L (``per_token`` [B, T]
    already carries 1 / L from ``_norm_prepare``), then the mean over the n_seqs sequences of the step:
    sum_i sum_t l_i,t / (n_seqs L). No length normalisation per sequence, so a long wrong answer is not diluted."""
    return (per_token * mask).sum() / n_seqs


def _norm_prepare(batch, backend) -> None:
    """``batch.agg_weights`` = 1 / L for every row, L = ``backend.norm_tokens`` (``algorithm.loss_norm_tokens``, null =
    ``sampling.max_tokens``: the generation budget, the same in every step)."""
    batch.agg_weights = torch.full((len(batch), 1), 1.0 / float(backend.norm_tokens))


AGGREGATIONS.register("seq_mean_token_sum_norm", seq_mean_token_sum_norm, spec=AggSpec(prepare=_norm_prepare))
