"""Advantage estimators, registered by name (``algorithm.advantage``)."""

from __future__ import annotations

import torch

from pods.registry import Registry

ADVANTAGES = Registry("advantage estimator")


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Group-normalised advantages on the KEPT rollouts: (r - mean) / (std + eps), unbiased std per row.

    rewards: [G, m] -> advantages [G, m]. A row of one rollout (m = 1) has std 0 by convention, so A = 0.
    """
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


@ADVANTAGES.register("mean_centered")
def mean_centered(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """r - mean per row, no std scaling (the Dr. GRPO variant). rewards: [G, m] -> [G, m]."""
    return rewards - rewards.mean(dim=1, keepdim=True)
