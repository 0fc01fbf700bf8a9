"""The training batch: B sequences laid out as [left-padded prompt | right-padded completion] (``TrainBatch``,
built by ``build_batch``), and the per-token statistics of a model on it (``token_stats`` -> ``TokenStats``),
computed through the chunked head of ``pods.losses`` so that no [B, C, V] logits exist. Public names, re-exported
by ``pods.backends.base`` and ``pods.backends``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from pods.losses import chunked_token_stats
from pods.models import unwrap
from pods.plan import split_to, token_micro_batches


@dataclass
class TokenStats:
    """Per completion token of a batch: log-probs [B, C] (float32; with grad when from a training forward)
    and entropies [B, C] over the whole vocabulary at the sampling temperature (no grad; None unless asked)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None


def token_stats(model, mb: TrainBatch, temperature: float, chunk_tokens: int | None, entropy: bool = False) -> TokenStats:
    """Run ``model`` (plain, peft, or a DeepSpeed engine) on ``mb`` and return its completion tokens' stats.

    The model itself computes logits for its last position only (``logits_to_keep=1``); the final hidden
    states are captured from its decoder and projected by ``lm_head`` ``chunk_tokens`` rows at a time
    (``pods.losses.chunked_token_stats``), so no [B, C, V] tensor exists. The model is still called through
    its own forward, so DeepSpeed's and peft's hooks run as usual.
    """
    hf = unwrap(model)
    captured = {}

    def grab(module, args, output):
        captured["h"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    P, C = mb.prompt_width, mb.loss_mask.shape[1]
    pos = (mb.attention_mask.cumsum(-1) - 1).clamp(min=0)
    handle = hf.get_decoder().register_forward_hook(grab)
    try:
        model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=pos, logits_to_keep=1, use_cache=False)
    finally:
        handle.remove()
    hidden = captured["h"][:, P - 1 : P + C - 1]  # position t predicts token t + 1
    logp, ent = chunked_token_stats(hf.get_output_embeddings(), hidden, mb.input_ids[:, P:], temperature, chunk_tokens, entropy)
    return TokenStats(logp, ent)


@dataclass
class TrainBatch:
    """B sequences laid out as [left-padded prompt | right-padded completion]; completions start at column P."""

    input_ids: torch.Tensor  # [B, P + C]
    attention_mask: torch.Tensor  # [B, P + C]
    prompt_width: int  # P
    loss_mask: torch.Tensor  # [B, C] float, 1 on completion tokens that enter the loss
    advantages: torch.Tensor  # [B]
    sampler_logprobs: torch.Tensor  # [B, C], 0 on padding
    token_weights: torch.Tensor | None = None  # [B, C]: a correction's importance weights (the policy loss; KL: kl_weighted)
    old_logprobs: torch.Tensor | None = None  # [B, C]; None = the current policy's (detached)
    group: torch.Tensor | None = None  # [B] long: the prompt group of each row (rows of one group share a prompt)
    agg_weights: torch.Tensor | None = None  # [B, 1] or [B, C]: the aggregation's factor (bnpo), on the whole loss
    weight_norm_mask: torch.Tensor | None = None  # [B, C]: set = token_weights divided per micro-batch by their mean here
    staleness: torch.Tensor | None = None  # [B] long: policy versions between each row's oldest token and this update

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, start: int, stop: int) -> TrainBatch:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v[start:stop] if isinstance(v, torch.Tensor) else v
        return TrainBatch(**out)

    def take(self, idx: torch.Tensor) -> TrainBatch:
        """The rows ``idx`` ([k] long), in that order."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(**{k: v.index_select(0, idx) if isinstance(v, torch.Tensor) else v for k, v in out.items()})

    def trimmed(self) -> TrainBatch:
        """The same rows trimmed to their own longest prompt (left columns) and completion (right columns): the columns
        dropped are padding on every row (attention 0, out of the loss). Positions come from the attention mask's
        cumulative sum (``token_stats``), so every kept token keeps its position and its log-prob up to rounding."""
        P, C = self.prompt_width, self.loss_mask.shape[1]
        p = int(self.attention_mask[:, :P].sum(1).max())
        c = max(1, int(self.attention_mask[:, P:].sum(1).max()))
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("input_ids", "attention_mask"):
                v = v[:, P - p : P + c]
            elif isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == C:
                v = v[:, :c]
            out[f.name] = v
        out["prompt_width"] = p
        return TrainBatch(**out)

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's prompt and completion length in tokens: ([B], [B]) long."""
        P = self.prompt_width
        return self.attention_mask[:, :P].sum(1), self.attention_mask[:, P:].sum(1)

    def to(self, device) -> TrainBatch:
        return TrainBatch(**{f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v) for f in fields(self)})


def build_batch(
    prompts: list[list[int]],
    completions: list[list[int]],
    sampler_logprobs: list[list[float]],
    advantages,
    pad_id: int,
    groups: list[int] | None = None,
) -> TrainBatch:
    """Stack sequences i = prompts[i] + completions[i] into a TrainBatch (CPU tensors); ``groups[i]`` = prompt group of row i."""
    P, C = max(map(len, prompts)), max(1, max(map(len, completions)))
    ids, attn, lmask, slp = [], [], [], []
    for p, c, lp in zip(prompts, completions, sampler_logprobs):
        ids.append([pad_id] * (P - len(p)) + p + c + [pad_id] * (C - len(c)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
        lmask.append([1.0] * len(c) + [0.0] * (C - len(c)))
        slp.append(list(lp) + [0.0] * (C - len(lp)))
    return TrainBatch(
        input_ids=torch.tensor(ids),
        attention_mask=torch.tensor(attn),
        prompt_width=P,
        loss_mask=torch.tensor(lmask),
        advantages=torch.as_tensor(advantages, dtype=torch.float32),
        sampler_logprobs=torch.tensor(slp),
        group=torch.tensor(groups, dtype=torch.long) if groups is not None else None,
    )


def budget_rows(batch: TrainBatch, size: int, budget: int, agree=lambda k: k) -> list[torch.Tensor]:
    """The rows of each token-budget micro-batch of ``batch`` (``pods.plan.token_micro_batches``: sorted by length, at
    most ``size`` rows and ``budget`` padded tokens each), split further (``pods.plan.split_to``) to the count
    ``agree(count)`` returns, the largest over ranks under ZeRO, so that every rank runs as many forwards."""
    p_len, c_len = (t.tolist() for t in batch.lengths())
    cuts = token_micro_batches(p_len, c_len, size, budget)
    cost = lambda rows: len(rows) * (max(p_len[i] for i in rows) + max(c_len[i] for i in rows))  # noqa: E731
    return [torch.tensor(c, dtype=torch.long) for c in split_to(cuts, agree(len(cuts)), cost)]
