"""A checkpointable prompt sampler: shuffled epochs over the training prompts from a seed.

With several ranks every rank walks the same global order and takes its own slice of each step's
``batch * world`` prompts, so the data position (the checkpointed state) is the same on every rank.
"""

from __future__ import annotations

import torch


class PromptSampler:
    def __init__(self, size: int, batch: int, seed: int, rank: int = 0, world: int = 1):
        if size < 1:
            raise ValueError("the training split has no prompts (after filtering by dataset.max_prompt_length)")
        self.size, self.batch, self.seed = size, batch, seed
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
        return out[self.rank * self.batch : (self.rank + 1) * self.batch]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "size": self.size, "seed": self.seed}

    def load_state_dict(self, sd: dict) -> None:
        if sd["size"] != self.size or sd["seed"] != self.seed:
            raise ValueError("checkpoint was written for a different training set or seed")
        self.epoch, self.pos = sd["epoch"], sd["pos"]
        self._order = self._perm()
