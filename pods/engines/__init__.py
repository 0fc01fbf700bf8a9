"""Rollout engines by name. Heavy engines are registered lazily, so ``import pods`` never imports vLLM."""

from pods.engines.base import ENGINES, Rollouts, Sampling

ENGINES.register_lazy("hf", "pods.engines.hf:HFEngine")

__all__ = ["ENGINES", "Rollouts", "Sampling"]
