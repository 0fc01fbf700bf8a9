"""Training backends by name: ``local`` (one process: LoRA or full fine-tuning). Heavy ones load lazily."""

from pods.backends.base import BACKENDS, OPTIMIZERS, Backend, TrainBatch, build_batch

BACKENDS.register_lazy("local", "pods.backends.local:LocalBackend")

__all__ = ["BACKENDS", "OPTIMIZERS", "Backend", "TrainBatch", "build_batch"]
