"""The policy update shared by every backend.

``Updater`` is the update: over five hooks, ``forward_stats(mb, entropy)`` (with grad; log-probs and, on request,
entropies of the completion tokens, from the chunked head in ``pods.losses``), ``forward_logprobs(mb)``,
``ref_logprobs(mb)`` (no grad), ``backward(loss)`` and ``optimizer_step(lr) -> grad_norm``, ``update`` turns a
step's kept rollouts into one (or ``ppo_epochs``) optimizer steps, accumulating gradients over micro-batches with
the whole batch's normalisers, so micro-batching never changes the gradient. A data-parallel backend also
overrides ``step_totals`` so that the normalisers are those of the step's batch over all ranks, and ``gap_totals``
so that the step's ``sampler_gap`` (``pods.backends.gap``: trainer vs sampler log-probs before the update) is too.
"""

from __future__ import annotations

import torch

from pods.backends.batch import TokenStats, TrainBatch, budget_rows
from pods.backends.gap import SUMS, GapCheck, add_gap, gap_sums
from pods.losses import AGGREGATIONS, POLICY_LOSSES, k3_kl
from pods.plan import mini_batch_bounds
from pods.progress import bar
from pods.schema import Algorithm, Root, Sampling


def loss_temperature(alg: Algorithm | Root, sampling: Sampling | None = None) -> float:
    """The temperature dividing the logits in the loss: ``algorithm.loss_temperature`` = ``sampling`` (the
    sampling temperature: the log-probs of the distribution the rollouts were drawn from) or a number (1.0 =
    the raw logits, as the authors' single-GPU trainer on TRL 0.14 did for samples drawn at T = 0.9).
    ``loss_temperature(cfg)`` with the whole config (the typed root) reads both sections of it."""
    if sampling is None:
        alg, sampling = alg.algorithm, alg.sampling
    t = alg.loss_temperature
    return float(sampling.temperature if t == "sampling" else t) or 1.0


class Updater:
    """The policy update over the five hooks of the module docstring. ``alg`` (the algorithm section), ``micro_batch_size`` and, for the hooks, the loss's ``temperature`` are set by the subclass."""

    alg: Algorithm
    micro_batch_size: int
    micro_batch_tokens: int | None = None  # hardware.micro_batch_tokens (set by the subclass; None = micro-batches by rows)
    norm_tokens: int = 1  # loss_agg seq_mean_token_sum_norm's constant
    device: torch.device = torch.device("cpu")
    gap_check: GapCheck | None = None  # what the sampler gap measures (pods.backends.gap); None: a plain sync check
    rank: int = 0

    def forward_stats(self, mb: TrainBatch, entropy: bool = False) -> TokenStats:
        raise NotImplementedError

    def forward_logprobs(self, mb: TrainBatch) -> torch.Tensor:
        return self.forward_stats(mb).logprobs

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

    def gap_totals(self, sums: torch.Tensor) -> torch.Tensor:
        """``gap_sums`` of this rank's rows -> over all ranks (sums and counts summed; the last, a max, maxed): a data-parallel backend's."""
        return sums

    def agree_count(self, count: int) -> int:
        """The number of micro-batches every rank runs (the largest over ranks: a data-parallel backend's)."""
        return count

    def micro_batch_rows(self, batch: TrainBatch, size: int | None = None) -> list[torch.Tensor] | None:
        """``hardware.micro_batch_tokens``: the rows of each micro-batch, as many on every rank (``budget_rows``); None =
        consecutive chunks of ``size`` rows (today's)."""
        if not self.micro_batch_tokens or len(batch) == 0:
            return None
        return budget_rows(batch, size or self.micro_batch_size, self.micro_batch_tokens, self.agree_count)

    def micro_batches(self, batch: TrainBatch, size: int | None = None, rows: list[torch.Tensor] | None = None):
        """The micro-batches of ``batch`` on the device: consecutive chunks of ``size`` rows, or (``rows``, from
        ``micro_batch_rows``) the given rows, each trimmed to its own longest prompt and completion."""
        rows = self.micro_batch_rows(batch, size) if rows is None else rows
        if rows is not None:
            yield from (batch.take(idx).trimmed().to(self.device) for idx in rows)
            return
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
        pre-pass that token selectors and corrections read before the update (one extra forward). Token-budget
        micro-batches (trimmed, rows reordered) are put back in the batch's row order and width (0 on padding)."""
        rows = self.micro_batch_rows(batch)
        parts = [self.forward_stats(mb, entropy) for mb in self.micro_batches(batch, rows=rows)]
        if rows is None:
            lp = torch.cat([p.logprobs.float().cpu() for p in parts])
            return TokenStats(lp, torch.cat([p.entropy.float().cpu() for p in parts]) if entropy else None)
        lp, ent = torch.zeros(batch.loss_mask.shape), torch.zeros(batch.loss_mask.shape) if entropy else None
        for idx, p in zip(rows, parts):
            lp[idx, : p.logprobs.shape[1]] = p.logprobs.float().cpu()
            if entropy:
                ent[idx, : p.entropy.shape[1]] = p.entropy.float().cpu()
        return TokenStats(lp, ent)

    def update(self, batch: TrainBatch, lr, micro_batch_size: int | None = None, progress: bool = False) -> dict:
        """The step's optimizer steps: one per mini-batch (``algorithm.mini_batch_size`` rows, ``pods.plan``) per
        ``ppo_epochs`` pass; returns the step's statistics. ``lr``: a number, or the LR as a function of the fraction
        of the step's optimizer steps done (``pods.plan.step_lr``). With several optimizer steps the old log-probs
        are fixed before the first (the correction's dense pre-pass, or one here), so the clipped ratio and the
        correction act across the later ones. ``sampler_gap`` (``pods.backends.gap``) is measured on the log-probs of
        the policy before this step's first optimizer step: that pre-pass, or the first optimizer step's forwards."""
        a = self.alg
        groups = batch.group.tolist() if batch.group is not None and AGGREGATIONS.spec(a.loss_agg).whole_groups else None
        bounds = mini_batch_bounds(len(batch), a.mini_batch_size, groups)
        total = a.ppo_epochs * len(bounds)
        if total > 1 and batch.old_logprobs is None:
            batch.old_logprobs = self.policy_logprobs(batch)  # the behaviour policy, fixed across the optimizer steps
        pre = batch.old_logprobs if total > 1 and batch.old_logprobs is not batch.sampler_logprobs else None
        gap = gap_sums(pre, batch.sampler_logprobs, batch.loss_mask) if pre is not None else torch.zeros(SUMS, dtype=torch.float64)
        lr_at = lr if callable(lr) else (lambda f: lr)
        done = []
        for i in range(total):
            lo, hi = bounds[i % len(bounds)]
            measure = gap if pre is None and i == 0 else None  # the first step's forwards: the weights the engine has
            done.append(self._optimizer_step_on(batch.rows(lo, hi), lr_at(i / total), micro_batch_size, progress, measure))
        steps = [d for d in done if d is not None]
        tokens = max(sum(d["tokens"] for d in steps), 1.0)
        return {
            **(self.gap_check or GapCheck())(self.gap_totals(gap), self.rank),
            "loss": sum(d["loss"] for d in steps) / max(len(steps), 1),
            "kl": sum(d["kl"] for d in steps) / tokens,
            "clip_frac": sum(d["clip_frac"] for d in steps) / tokens,
            "grad_norm": steps[-1]["grad_norm"] if steps else 0.0,
            "lr": steps[-1]["lr"] if steps else lr_at(0.0),
            "optimizer_steps": len(steps),
        }

    def _optimizer_step_on(
        self, batch: TrainBatch, lr: float, micro_batch_size: int | None, progress: bool, gap: torch.Tensor | None = None
    ) -> dict | None:
        """One optimizer step on ``batch`` (a mini-batch), accumulated over micro-batches with its normalisers over all
        ranks; None, and no step at all, when no rank has a token in the loss (nothing to train: a step whose every
        sequence a correction rejected). Returns sums: loss, kl and clipped tokens, tokens, the grad norm, the LR.
        ``gap``: ``gap_sums`` of the forwards' log-probs vs the sampler's are added to it (the sampler gap)."""
        a = self.alg
        loss_fn, agg = POLICY_LOSSES.get(a.policy_loss), AGGREGATIONS.get(a.loss_agg)
        n_seqs, n_tokens = self.step_totals(len(batch), int(batch.loss_mask.sum().item()))
        if n_tokens == 0:
            return None
        prepare = AGGREGATIONS.spec(a.loss_agg).prepare
        if prepare is not None:  # per-row normalisers over the optimizer step (bnpo's per-group token counts)
            prepare(batch, self)
        sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "tokens": n_tokens, "lr": lr}
        for mb in bar(list(self.micro_batches(batch, micro_batch_size)), desc="update", leave=False, disable=not progress):
            logp = self.forward_logprobs(mb)
            if gap is not None:
                add_gap(gap, gap_sums(logp, mb.sampler_logprobs, mb.loss_mask))
            old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
            per_tok, clipped = loss_fn(logp, old, mb.advantages, a.epsilon, a.epsilon_high or a.epsilon, mask=mb.loss_mask)
            kl = k3_kl(logp, self.ref_logprobs(mb), a.kl_clamp) if a.beta > 0 else None
            per_tok = self._weighted(per_tok, kl, mb)
            loss = agg(per_tok, mb.loss_mask, n_seqs, n_tokens)
            self.backward(loss)
            sums["loss"] += float(loss.detach())
            sums["clip_frac"] += float((clipped.float() * mb.loss_mask).sum())
            sums["kl"] += float((kl.detach() * mb.loss_mask).sum()) if kl is not None else 0.0
        sums["grad_norm"] = self.optimizer_step(lr)
        return sums

    def _weighted(self, pg: torch.Tensor, kl: torch.Tensor | None, mb: TrainBatch) -> torch.Tensor:
        """The per-token loss [B, C]: the policy loss ``pg`` times the correction's weights ``w`` (normalised here per
        micro-batch when ``mb.weight_norm_mask`` is set), plus beta x ``kl`` (weighted too unless
        ``algorithm.kl_weighted`` is false), all times the aggregation's factor ``mb.agg_weights``."""
        a, w = self.alg, mb.token_weights
        if w is not None and mb.weight_norm_mask is not None:
            m = mb.weight_norm_mask
            mean = float((w * m).sum()) / max(float(m.sum()), 1.0)
            w = w / mean if float(m.sum()) > 0 and mean > 1e-8 else w  # the release skips a mean below 1e-8
        if kl is None:
            per_tok = pg if w is None else pg * w
        elif w is None or a.kl_weighted:
            per_tok = pg + a.beta * kl if w is None else (pg + a.beta * kl) * w
        else:
            per_tok = pg * w + a.beta * kl
        return per_tok if mb.agg_weights is None else per_tok * mb.agg_weights
