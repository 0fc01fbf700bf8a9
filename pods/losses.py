"""Per-token policy losses and how they are aggregated, each registered by name.

Shapes: B sequences, T completion positions. ``mask`` [B, T] marks tokens that enter the loss (completion
tokens, possibly thinned by a token-level selector); ``weights`` [B, T] multiplies per-token losses.
Aggregators take the normalisers of the WHOLE optimizer-step batch, so splitting it into micro-batches
with gradient accumulation yields exactly the big-batch gradient.
"""

from __future__ import annotations

import torch

from pods.registry import Registry

POLICY_LOSSES = Registry("policy loss")
AGGREGATIONS = Registry("loss aggregation")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature). logits [B, T, V], targets [B, T] -> [B, T]."""
    logits = logits.float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0. [B, T] -> [B, T]."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


@POLICY_LOSSES.register("clipped")
def clipped_surrogate(logp, old_logp, advantages, eps_low: float, eps_high: float):
    """PPO clipped surrogate, negated for minimisation.

    logp, old_logp: [B, T]; advantages: [B] (one per sequence). Returns (loss [B, T], clipped [B, T] bool):
    loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), ratio = exp(logp - old_logp).
    """
    ratio = torch.exp(logp - old_logp)
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
