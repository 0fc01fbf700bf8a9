"""Training backends by name: ``local`` (one process: LoRA or full fine-tuning), ``deepspeed`` (ZeRO-2/3 over
several processes, full fine-tuning). Heavy ones load lazily: ``import pods`` never imports DeepSpeed."""

from pods.backends.base import BACKENDS, OPTIMIZERS, Backend, Sections, TokenStats, TrainBatch, Updater, build_batch

BACKENDS.register_lazy("local", "pods.backends.local:LocalBackend")
BACKENDS.register_lazy("deepspeed", "pods.backends.deepspeed:DeepSpeedBackend")

__all__ = ["BACKENDS", "OPTIMIZERS", "Backend", "Sections", "TokenStats", "TrainBatch", "Updater", "build_batch"]
