"""Weight sync into a vLLM engine that runs in its own process (``rollout.multiprocessing: true``).

vLLM's RPC serialises tensors as nested lists, so the weights travel as one safetensors blob and the
worker-side extension (named by ``worker_extension_cls``) unpacks it and calls ``reload_weights``.
The default in-process engine does not use this module: it passes tensors by reference.
"""

from __future__ import annotations

import torch


def pack(named_tensors) -> bytes:
    """safetensors bytes of CPU copies (tied tensors are cloned: safetensors refuses shared storage)."""
    from safetensors.torch import save

    return save({name: t.detach().to("cpu", copy=True).contiguous() for name, t in named_tensors})


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def pods_reload_weights(self, blob: bytes) -> None:
        from safetensors.torch import load

        with torch.no_grad():
            self.reload_weights(weights_iterator=iter(load(blob).items()))
