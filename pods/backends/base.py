"""The training batch and the policy update shared by every backend.

A backend supplies five hooks: ``forward_stats(mb, entropy)`` (with grad; log-probs and, on request,
entropies of the completion tokens, from the chunked head in ``pods.losses``), ``forward_logprobs(mb)``,
``ref_logprobs(mb)`` (no grad), ``backward(loss)`` and ``optimizer_step(lr) -> grad_norm``. ``Backend.update`` turns a step's kept
rollouts into one (or ``ppo_epochs``) optimizer steps, accumulating gradients over micro-batches with the
whole batch's normalisers, so micro-batching never changes the gradient. A data-parallel backend also
overrides ``step_totals`` so that the normalisers are those of the step's batch over all ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from tqdm import tqdm

from pods.losses import AGGREGATIONS, POLICY_LOSSES, chunked_token_stats, k3_kl
from pods.registry import Registry

BACKENDS = Registry("training backend")
OPTIMIZERS = Registry("optimizer")


@OPTIMIZERS.register("adamw")
def adamw(params, o: dict):
    return torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])


@OPTIMIZERS.register("adamw_8bit")
def adamw_8bit(params, o: dict):  # the authors' single-GPU optimizer; needs bitsandbytes and a GPU
    import bitsandbytes as bnb

    return bnb.optim.AdamW8bit(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])


@dataclass
class TokenStats:
    """Per completion token of a batch: log-probs [B, C] (float32; with grad when from a training forward)
    and entropies [B, C] over the whole vocabulary at the sampling temperature (no grad; None unless asked)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None


def _hf_model(model):
    """The transformers model under a DeepSpeed engine (``.module``) and/or a peft wrapper."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def token_stats(model, mb: TrainBatch, temperature: float, chunk_tokens: int | None, entropy: bool = False) -> TokenStats:
    """Run ``model`` (plain, peft, or a DeepSpeed engine) on ``mb`` and return its completion tokens' stats.

    The model itself computes logits for its last position only (``logits_to_keep=1``); the final hidden
    states are captured from its decoder and projected by ``lm_head`` ``chunk_tokens`` rows at a time
    (``pods.losses.chunked_token_stats``), so no [B, C, V] tensor exists. The model is still called through
    its own forward, so DeepSpeed's and peft's hooks run as usual.
    """
    hf = _hf_model(model)
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


def loss_temperature(cfg: dict) -> float:
    """The temperature dividing the logits in the loss: ``algorithm.loss_temperature`` = ``sampling`` (the
    sampling temperature: the log-probs of the distribution the rollouts were drawn from) or a number (1.0 =
    the raw logits, as the authors' single-GPU trainer on TRL 0.14 did for samples drawn at T = 0.9)."""
    t = cfg["algorithm"]["loss_temperature"]
    return float(cfg["sampling"]["temperature"] if t == "sampling" else t) or 1.0


@dataclass
class TrainBatch:
    """B sequences laid out as [left-padded prompt | right-padded completion]; completions start at column P."""

    input_ids: torch.Tensor  # [B, P + C]
    attention_mask: torch.Tensor  # [B, P + C]
    prompt_width: int  # P
    loss_mask: torch.Tensor  # [B, C] float, 1 on completion tokens that enter the loss
    advantages: torch.Tensor  # [B]
    sampler_logprobs: torch.Tensor  # [B, C], 0 on padding
    token_weights: torch.Tensor | None = None  # [B, C]
    old_logprobs: torch.Tensor | None = None  # [B, C]; None = the current policy's (detached)
    group: torch.Tensor | None = None  # [B] long: the prompt group of each row (rows of one group share a prompt)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, start: int, stop: int) -> TrainBatch:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v[start:stop] if isinstance(v, torch.Tensor) else v
        return TrainBatch(**out)

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


class Backend:
    """Subclasses set ``self.alg`` (algorithm dict), ``self.micro_batch_size``, ``self.temperature``."""

    alg: dict
    micro_batch_size: int
    device: torch.device = torch.device("cpu")
    collective_forward: bool = False  # True when every forward is a collective over ranks (ZeRO-3): ranks run them in lockstep

    def forward_stats(self, mb: TrainBatch, entropy: bool = False) -> TokenStats:
        raise NotImplementedError

    def forward_logprobs(self, mb: TrainBatch) -> torch.Tensor:
        raise NotImplementedError

    def ref_logprobs(self, mb: TrainBatch) -> torch.Tensor:
        raise NotImplementedError

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self, lr: float) -> float:
        raise NotImplementedError

    def step_totals(self, n_seqs: int, n_tokens: int) -> tuple[float, float]:
        """The loss normalisers (sequences, loss tokens) of one optimizer step. A data-parallel backend that
        averages gradients over ranks returns the totals over all ranks divided by the world size."""
        return n_seqs, n_tokens

    def micro_batches(self, batch: TrainBatch, size: int | None = None):
        size = size or self.micro_batch_size
        for start in range(0, len(batch), size):
            yield batch.rows(start, start + size).to(self.device)

    @torch.no_grad()
    def policy_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Current-policy log-probs of the completion tokens, [B, C], without grad."""
        return self.policy_stats(batch).logprobs

    @torch.no_grad()
    def policy_stats(self, batch: TrainBatch, entropy: bool = False) -> TokenStats:
        """Current-policy stats of the whole batch (no grad, CPU, float32), micro-batch by micro-batch: the
        pre-pass that token selectors and corrections read before the update (one extra forward)."""
        parts = [self.forward_stats(mb, entropy) for mb in self.micro_batches(batch)]
        lp = torch.cat([p.logprobs.float().cpu() for p in parts])
        return TokenStats(lp, torch.cat([p.entropy.float().cpu() for p in parts]) if entropy else None)

    def update(self, batch: TrainBatch, lr: float, micro_batch_size: int | None = None, progress: bool = False) -> dict:
        """One optimizer step per ppo epoch over the whole batch; returns the step's statistics."""
        a = self.alg
        loss_fn, agg = POLICY_LOSSES.get(a["policy_loss"]), AGGREGATIONS.get(a["loss_agg"])
        eps_low = a["epsilon"]
        eps_high = a["epsilon_high"] or eps_low
        beta = a["beta"]
        n_seqs, n_tokens = self.step_totals(len(batch), int(batch.loss_mask.sum().item()))
        if hasattr(agg, "prepare"):  # per-row normalisers over the whole step (bnpo's per-group token counts)
            agg.prepare(batch, self)
        if a["ppo_epochs"] > 1 and batch.old_logprobs is None:
            batch.old_logprobs = self.policy_logprobs(batch)  # fixed behaviour policy across epochs
        sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0}
        grad_norms = []
        for _ in range(a["ppo_epochs"]):
            for mb in tqdm(list(self.micro_batches(batch, micro_batch_size)), desc="update", leave=False, disable=not progress):
                logp = self.forward_logprobs(mb)
                old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
                per_tok, clipped = loss_fn(logp, old, mb.advantages, eps_low, eps_high)
                if beta > 0:
                    kl = k3_kl(logp, self.ref_logprobs(mb))
                    per_tok = per_tok + beta * kl
                    sums["kl"] += float((kl.detach() * mb.loss_mask).sum())
                if mb.token_weights is not None:
                    per_tok = per_tok * mb.token_weights
                loss = agg(per_tok, mb.loss_mask, n_seqs, n_tokens)
                self.backward(loss)
                sums["loss"] += float(loss.detach())
                sums["clip_frac"] += float((clipped.float() * mb.loss_mask).sum())
            grad_norms.append(self.optimizer_step(lr))
        epochs = a["ppo_epochs"]
        denom = max(n_tokens, 1) * epochs
        return {
            "loss": sums["loss"] / epochs,
            "kl": sums["kl"] / denom,
            "clip_frac": sums["clip_frac"] / denom,
            "grad_norm": grad_norms[-1],
            "lr": lr,
        }
