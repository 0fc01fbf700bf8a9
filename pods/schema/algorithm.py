"""The ``algorithm`` section: n, m, the down-sampling rule, the loss, D3S and Sparse-RL options, the corrections."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from pods.errors import need
from pods.schema.base import Frac, NonNegF, Pos, PosF, Section


class SparseRl(Section):
    """Sparse-RL's correction (pods.sparse_rl): the released thresholds; the normaliser's defaults are pods' (the
    release's: ``weight_norm: all``, ``norm_scope: micro_batch``; docs/sparse-rl.md)."""

    veto: PosF = 1.0e-4  # a sequence with any UNCLAMPED ratio pi_old / pi_sparse below this is dropped
    band_low: NonNegF = 0.5  # tokens whose ratio is outside [band_low, band_high] are masked
    band_high: PosF = 1.5
    cap: PosF = 1.5  # weights min(r, cap)
    log_ratio_clamp: PosF = 20.0
    weight_norm: Literal["valid", "all", "none"] = "valid"  # the weights average 1 over: the kept tokens | all | no normalisation
    norm_scope: Literal["step", "micro_batch"] = "step"  # that mean over the step on all ranks | per micro-batch and rank (released)

    @model_validator(mode="after")
    def _band(self) -> SparseRl:
        need(self.band_low < self.band_high, f"algorithm.sparse_rl.band_low < band_high required, got [{self.band_low}, {self.band_high}]")
        return self


class Algorithm(Section):
    name: str
    n: Pos
    m: Pos
    rule: str  # pods.downsample.RULES
    grad_accum: bool = False
    advantage: str = "grpo"  # pods.advantages.ADVANTAGES: (r - mean) / (std + 1e-4) per group
    advantage_scope: Literal["kept", "group"] = "kept"  # advantages over the KEPT rollouts, or the full group (D3S)
    policy_loss: str = "clipped"  # pods.losses.POLICY_LOSSES
    loss_agg: str = "seq_mean"  # pods.losses.AGGREGATIONS
    loss_temperature: Literal["sampling"] | PosF = "sampling"  # logits / T in the loss: the sampling T, or this number
    epsilon: PosF = 0.2
    epsilon_high: PosF | None = None  # null = epsilon (symmetric clip)
    beta: NonNegF = 0.0  # k3 KL to the reference policy (LoRA: adapter disabled)
    ppo_epochs: Pos = 1  # passes over the step's kept rollouts
    mini_batch_size: Pos | None = None  # rollouts per optimizer step (per rank); null = all kept rollouts: one step per pass
    kl_clamp: PosF | None = None  # the k3 KL estimate clamped to [-kl_clamp, kl_clamp] (Sparse-RL's release: 10); null = none
    kl_weighted: bool = True  # the KL term multiplied by the correction's token weights (false: Sparse-RL's release)
    token_rule: str = "all"  # pods.tokens.TOKEN_SELECTORS: which completion tokens enter the loss
    correction: str | list[str] = "none"  # pods.tokens.CORRECTIONS: sampler-vs-policy correction(s), a list runs each in turn
    correction_level: Literal["token", "sequence"] = "token"  # behaviour_is: per-token ratio, or each row's geometric mean
    correction_clip: PosF = 2.0  # behaviour_is: the upper bound C of the ratio (TIS's 2; >= 1)
    correction_low: NonNegF = 0.0  # behaviour_is: the lower bound c of the ratio (<= 1); 0 = none
    correction_mode: Literal["truncate", "mask"] = "truncate"  # behaviour_is: ratios outside [c, C] clamped to it, or weighted 0
    m_final: Pos | None = None  # D3S: kept rollouts at progress 1
    m_intra: Pos | None = None  # rule d3s_two_stage: rollouts per group its intra-group stage keeps first (null = n)
    token_keep: Frac | None = None  # D3S: fraction of tokens kept at progress 0
    token_keep_final: Frac | None = None
    ramp: str = "linear"  # pods.schedules.RAMPS: value = (1 - r(p)) init + r(p) final
    sparse_rl: SparseRl = SparseRl()  # read by correction=sparse_rl only
    # overlong handling and Dr.GRPO (docs/knobs.md)
    mask_truncated: bool = False  # rows cut at sampling.max_tokens leave the loss (DAPO's overlong filtering)
    overlong_buffer: Pos | None = None  # DAPO's soft overlong punishment: a linear penalty over the last this many tokens; null = off
    overlong_penalty: NonNegF = 1.0  # the penalty at the limit (a reward term "overlong" in [-overlong_penalty, 0])
    loss_norm_tokens: Pos | None = None  # loss_agg seq_mean_token_sum_norm's constant; null = sampling.max_tokens

    @model_validator(mode="after")
    def _counts(self) -> Algorithm:
        """m of n, GRPO-GA's micro-batches, rule ``all``, D3S's schedule of kept rollouts."""
        n, m = self.n, self.m
        need(m <= n, f"algorithm.m ({m}) must be <= algorithm.n ({n}): m rollouts are kept out of n")
        if self.grad_accum:
            need(self.rule == "all", f"algorithm.grad_accum trains all n rollouts: algorithm.rule must be 'all', got '{self.rule}'")
            need(n % m == 0, f"algorithm.grad_accum: algorithm.n ({n}) must be divisible by algorithm.m ({m}), the micro-batch")
        elif self.rule == "all":
            need(m == n, f"algorithm.rule 'all' keeps every rollout: algorithm.m ({m}) must equal algorithm.n ({n})")
        if self.m_final is not None:
            need(self.m_final <= n, f"algorithm.m_final must be an integer in [1, n={n}] (or null), got {self.m_final!r}")
            need(not self.grad_accum, "algorithm.m_final (a schedule of kept rollouts) cannot be used with algorithm.grad_accum")
            need(self.rule != "all", "algorithm.m_final needs a down-sampling rule; rule 'all' keeps every rollout")
        if self.mini_batch_size is not None and self.loss_agg == "bnpo":
            need(
                self.mini_batch_size % m == 0 and self.m_final is None,
                f"algorithm.loss_agg 'bnpo' normalises per prompt group: algorithm.mini_batch_size ({self.mini_batch_size}) must hold "
                f"whole groups (a multiple of m={m}, with m_final null)",
            )
        if self.m_intra is not None:
            top = max(m, self.m_final or m)
            need(top <= self.m_intra <= n, f"algorithm.m_intra must be in [max(m, m_final)={top}, n={n}] (or null), got {self.m_intra}")
        return self

    @model_validator(mode="after")
    def _corrections(self) -> Algorithm:
        """A list of corrections (run in turn, weights multiplied: pods.behaviour_is): distinct names, no ``none``."""
        names = [self.correction] if isinstance(self.correction, str) else list(self.correction)
        need(len(names) > 0, "algorithm.correction: an empty list; use none")
        need(len(names) == len(set(names)), f"algorithm.correction lists a name twice: {names}")
        need(len(names) == 1 or "none" not in names, f"algorithm.correction: 'none' cannot be combined with others: {names}")
        self.correction = names[0] if len(names) == 1 else names
        need(
            self.correction_clip >= 1,
            f"algorithm.correction_clip must be >= 1 (below 1 it scales down on-policy tokens), got {self.correction_clip}",
        )
        need(
            self.correction_low <= 1,
            f"algorithm.correction_low must be <= 1 (above 1 it scales up or masks on-policy tokens), got {self.correction_low}",
        )
        return self
