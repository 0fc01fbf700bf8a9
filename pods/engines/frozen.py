"""``Frozen``: a policy engine (HF, sparse HF) on its own copy of the policy, so that the producer thread of
``train.max_staleness >= 1`` (``pods.loop.producer``) generates while the trainer updates the live module."""

from __future__ import annotations

import copy

import torch

from pods.engines.base import Engine


class Frozen(Engine):
    """``engine``'s kind, built over a deep copy of its policy (no gradients). ``load_weights`` takes the live
    module's ``state_dict`` items (the copy's own names)."""

    needs_sync = True

    def __init__(self, engine, model_dir, tokenizer):
        self.copy = copy.deepcopy(engine.policy).requires_grad_(False)
        self.inner = type(engine)(model_dir, tokenizer, engine.cfg, policy=self.copy)

    def generate(self, prompts, n, sampling, progress=False):
        return self.inner.generate(prompts, n, sampling, progress)

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        own = self.copy.state_dict()
        for name, t in named_tensors:
            own[name].copy_(t)
        self.version += 1
