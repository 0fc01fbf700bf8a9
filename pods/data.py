"""A checkpointable prompt sampler: shuffled epochs over the training prompts from a seed.

With several ranks every rank walks the same global order and takes its own slice of each step's
``batch * world`` prompts, so the data position (the checkpointed state) is the same on every rank.
With ``repeats = r`` (``train.group_repeats``) a rank's ``batch`` groups are ``batch / r`` distinct prompts,
each repeated r times in a row: independent groups of n rollouts of the SAME prompt in one step (the
authors' 8-GPU runs: one prompt per GPU per optimizer step, its accumulation groups all of that prompt).
"""

from __future__ import annotations

import torch


class PromptSampler:
    def __init__(self, size: int, batch: int, seed: int, rank: int = 0, world: int = 1, repeats: int = 1):
        if size < 1:
            raise ValueError("the training split has no prompts (after filtering by dataset.max_prompt_length)")
        if repeats < 1 or batch % repeats:
            raise ValueError(f"train.group_repeats = {repeats} must divide train.prompts_per_step = {batch}")
        self.size, self.batch, self.seed, self.repeats = size, batch // repeats, seed, repeats
        self.rank, self.world = rank, world
        self.epoch, self.pos = 0, 0
        self._order = self._perm()

    def _perm(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def next(self) -> list[int]:
        out, total = [], self.batch * self.world
        while len(out) < total:
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            take = min(total - len(out), self.size - self.pos)
            out += self._order[self.pos : self.pos + take]
            self.pos += take
        return [i for i in out[self.rank * self.batch : (self.rank + 1) * self.batch] for _ in range(self.repeats)]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "size": self.size, "seed": self.seed}

    def load_state_dict(self, sd: dict) -> None:
        if sd["size"] != self.size or sd["seed"] != self.seed:
            raise ValueError("checkpoint was written for a different training set or seed")
        self.epoch, self.pos = sd["epoch"], sd["pos"]
        self._order = self._perm()
