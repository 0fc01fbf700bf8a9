"""The HF ``generate`` engine: samples with the live training module, so there is nothing to sync."""

from __future__ import annotations

import torch

from pods.engines.base import PolicyEngine, Rollouts, Sampling
from pods.models import unwrap
from pods.progress import bar
from pods.schema import HfRollout


class HFEngine(PolicyEngine):
    """``rollout=hf``: ``transformers``' ``generate`` on ``rollout.max_batch`` sequences per call."""

    section = HfRollout
    label = "hf"

    def __init__(self, model_dir, tokenizer, cfg: HfRollout, policy=None):
        super().__init__(model_dir, tokenizer, cfg, policy)
        self.max_batch = self.cfg.max_batch  # sequences per generate call

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling, progress: bool = False) -> Rollouts:
        per_call = max(1, self.max_batch // n)  # prompts per generate call
        out_ids, out_lp, reasons = [], [], []
        was_training = self.policy.training
        self.policy.eval()
        chunks = range(0, len(prompts), per_call)
        for start in bar(chunks, desc="generate", leave=False, disable=not progress):
            ids, lps, rs = self._generate_chunk(prompts[start : start + per_call], n, sampling)
            out_ids += ids
            out_lp += lps
            reasons += rs
        self.policy.train(was_training)
        texts = self.tok.batch_decode(out_ids, skip_special_tokens=True)
        return Rollouts(prompt_ids=prompts, completion_ids=out_ids, texts=texts, logprobs=out_lp, finish_reasons=reasons, n=n)

    def _generate_chunk(self, prompts, n, s: Sampling):
        from transformers import GenerationConfig, LogitsProcessorList

        device = next(self.policy.parameters()).device
        prompts = [p for p in prompts for _ in range(n)]  # expanded by hand: greedy with n > 1 works too
        width = max(map(len, prompts))
        pad = self.tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        greedy = s.temperature <= 0
        # An explicit config: the model's own generation_config (e.g. Qwen2.5's repetition_penalty 1.05)
        # would change the sampling distribution away from the log-probs reported below.
        # Temperature, top-k and top-p are applied by the recorder (below), after it has taken the log-probs of the
        # raw logits / T: generate() itself samples from what the recorder returns, with no warper of its own.
        record = _LogprobRecorder(1.0 if greedy else s.temperature, 0 if greedy else s.top_k, 1.0 if greedy else s.top_p)
        config = GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=s.max_tokens,
            pad_token_id=pad,
            eos_token_id=sorted(self.stop_ids),
            stop_strings=list(s.stop) or None,
            return_dict_in_generate=True,
            **({} if greedy else dict(temperature=1.0, top_k=0, top_p=1.0)),
        )
        if s.seed is not None:
            torch.manual_seed(s.seed)
        inner = unwrap(self.policy)
        saved, inner.generation_config = inner.generation_config, GenerationConfig()  # generate() would merge its values in
        try:
            gen = self.policy.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=LogitsProcessorList([record]),
                tokenizer=self.tok if s.stop else None,
            )
        finally:
            inner.generation_config = saved
        new = gen.sequences[:, width:]  # [B, C]
        lp = record.finish(new).tolist()
        out_ids, out_lp, reasons = [], [], []
        for row, row_lp in zip(new.tolist(), lp):
            end = next((i for i, t in enumerate(row) if t in self.stop_ids), None)
            keep = len(row) if end is None else end + 1  # keep the stop token: the policy learns to stop
            out_ids.append(row[:keep])
            out_lp.append(row_lp[:keep])
            reasons.append("length" if end is None else "stop")
        return out_ids, out_lp, reasons


class _LogprobRecorder:
    """A logits processor that takes each sampled token's log-prob under the raw logits / T as generation goes, so
    that one step's [B, V] float32 log-softmax is alive at a time (``output_logits`` would keep every step's: 20 GB
    for 8 sequences of 4,096 tokens over a 152k vocabulary), then applies temperature, top-k and top-p in
    transformers' order (top-k, top-p on the scaled logits), as ``generate`` would have. The log-prob reported is
    the trainer's: logits / T, with no top-k/top-p renormalisation.

    At step t it sees the token chosen at step t - 1 (the last column of ``input_ids``) and reads its log-prob from
    the previous step's log-softmax; ``finish`` reads the last token's."""

    def __init__(self, temperature: float, top_k: int, top_p: float):
        from transformers import TopKLogitsWarper, TopPLogitsWarper

        self.temperature, self.prev, self.logprobs = temperature, None, []
        self.warpers = [TopKLogitsWarper(top_k)] if top_k > 0 else []
        self.warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.logprobs.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        scores = scores / self.temperature  # what transformers' temperature warper does, first
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        return scores

    def finish(self, new: torch.Tensor) -> torch.Tensor:
        """[B, C] log-probs of the C generated tokens ``new`` (C = the number of steps this recorder saw)."""
        if self.prev is not None:
            self.logprobs.append(self.prev.gather(-1, new[:, len(self.logprobs)].unsqueeze(-1)).squeeze(-1))
        self.prev = None
        if not self.logprobs:
            return new.new_zeros(new.shape, dtype=torch.float32)
        assert len(self.logprobs) == new.shape[1], (len(self.logprobs), new.shape)
        return torch.stack(self.logprobs, dim=1)
