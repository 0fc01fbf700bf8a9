"""The chunked head under DeepSpeed ZeRO-3 with the GPU profile's ZeRO settings, for real on CPU (2 gloo ranks).

``hardware.logprob_chunk_tokens`` splits the loss's log-softmax into chunks of rows (``pods.losses.chunked_token_stats``,
each chunk checkpointed under grad). Under ZeRO-3 the head's weight is partitioned: every call of the head MODULE
gathers it. The worker (this file under torchrun) applies two optimizer steps to the fixed batch on 2 ranks with
several chunks per micro-batch, with each rank's rows cut to their own width as ``build_batch`` pads them (the ranks
then run different numbers of chunks), and with one chunk; it counts the all-gathers of the tied head weight per
micro-batch (forward and backward), and the test compares all three with the single-process update (``LocalBackend``).

Before the head module was called once per micro-batch (one call per chunk), DeepSpeed re-gathered the head per chunk
in the forward and twice per chunk in the backward whenever its trace of the module order was incomplete (the first
micro-batch, and the two after any change of the chunk count), and the ragged layout hung: ranks with different chunk
counts issued different collectives (gloo timed out; docs/memory.md, "ZeRO-3 and the chunked head").

ZeRO settings: ``h100x8_zero3`` sets ``overlap_comm: true`` and leaves every other ZeRO size at DeepSpeed's default
(asserted below). Those sizes are scaled to the tiny model so that prefetch and release happen as on the GPU
(``scaled_zero``); the counts below also assert that prefetches and releases did happen.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from support.harness import EQUIV, EQUIV_LRS, assert_two_ranks_equal_one, fixed_batch, in_one_process, on_two_ranks, torchrun, weight_gap

QWEN3B_HEAD = 151_936 * 2_048  # Qwen2.5-3B's tied embedding / lm_head: vocab x hidden (311M)
GPU_ZERO_DEFAULTS = {  # DeepSpeed 0.19.8's defaults, which h100x8_zero3 runs with (test_the_gpu_profile_keeps_...)
    "stage3_prefetch_bucket_size": 5e7,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "reduce_bucket_size": 5e8,
    "sub_group_size": 1e9,
}
# 1e5 on the GPU lies between Qwen2.5-3B's largest vector (2,048) and its smallest matrix (k_proj, 2,048 x 256): norms
# and biases persist, every matrix is partitioned. 1,000 splits the tiny model (vectors <= 128, matrices >= 8,192) alike.
PERSISTENCE = 1_000
CHUNK = 5  # logprob_chunk_tokens: the fixed batch has 12 completion columns; 2 rows -> 5 chunks, 3 rows -> 8, 1 row -> 3
MICRO = [2, 3]  # micro-batch sizes of the two steps on each rank's 4 rows: (2, 2), then (3, 1): the chunk count changes
VARIANTS = [
    ("chunks", CHUNK, False),
    ("ragged", CHUNK, True),
    ("one_chunk", None, False),
]  # name, chunk rows, own widths


def scaled_zero(tiny_head: int) -> dict:
    """The GPU profile's ZeRO-3 sizes scaled by tiny head / Qwen2.5-3B head (1.24e-4), so that each relates to the
    head weight as on the GPU (prefetch bucket 0.16 heads, max live and reuse distance 3.2 heads), plus ``PERSISTENCE``."""
    scale = tiny_head / QWEN3B_HEAD
    return {**{k: int(v * scale) for k, v in GPU_ZERO_DEFAULTS.items()}, "stage3_param_persistence_threshold": PERSISTENCE}


def overrides(chunk: int | None) -> list[str]:
    """EQUIV with the GPU profile's ZeRO-3 settings (scaled) and gradient checkpointing, ``chunk`` rows per chunk."""
    import json

    from pods.tiny import ensure_tiny

    arch = json.loads((ensure_tiny() / "config.json").read_text())
    zero = scaled_zero(arch["vocab_size"] * arch["hidden_size"])
    out = [*EQUIV, "hardware.deepspeed.overlap_comm=true", "hardware.gradient_checkpointing=true"]
    out += [f"++hardware.deepspeed.config.zero_optimization.{k}={v}" for k, v in zero.items()]
    return [*out, f"hardware.logprob_chunk_tokens={chunk if chunk else 'null'}"]


# ----------------------------------------------------------------------------------------------------------
# Counting the head's all-gathers: DeepSpeed 0.19.8's coordinator gathers through one private method
# (``PartitionedParameterCoordinator.__all_gather_params_``, fetch and prefetch alike); other paths call
# ``param.all_gather()`` (a parameter read outside its module's hooks, ``GatheredParameters``). Both are wrapped.
# ----------------------------------------------------------------------------------------------------------
class GatherCounter:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.gathers: dict[int, int] = {}  # id(param) -> all-gathers that included it (it was NOT_AVAILABLE)
        self.releases: dict[int, int] = {}  # id(param) -> partitions (the gathered copy freed)
        self.prefetched = 0  # parameters gathered ahead of the module that uses them
        self.invalidated = 0  # trace invalidations (the module order changed: no prefetch for that pass)
        self._current: set[int] = set()

    def install(self) -> None:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as C
        from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params

        gather, fetch, invalidate = C._PartitionedParameterCoordinator__all_gather_params_, C._fetch_sub_module_impl, C._invalidate_trace

        def counted_gather(coord, params, forward, quantize=False):
            for p in params:
                if p.ds_status == ZeroParamStatus.NOT_AVAILABLE:
                    self.gathers[id(p)] = self.gathers.get(id(p), 0) + 1
                    self.prefetched += id(p) not in self._current
            return gather(coord, params, forward, quantize)

        def counted_fetch(coord, module, forward, is_leaf):
            self._current = {id(p) for p in iter_params(module, recurse=is_leaf)}
            return fetch(coord, module, forward, is_leaf)

        def counted_invalidate(coord):
            self.invalidated += 1
            return invalidate(coord)

        C._PartitionedParameterCoordinator__all_gather_params_ = counted_gather
        C._fetch_sub_module_impl, C._invalidate_trace = counted_fetch, counted_invalidate

    def watch(self, param) -> None:
        """Count this parameter's direct gathers and its releases too."""
        direct, part = param.all_gather, param.partition

        def all_gather(*args, **kwargs):
            from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

            if param.ds_status == ZeroParamStatus.NOT_AVAILABLE:
                self.gathers[id(param)] = self.gathers.get(id(param), 0) + 1
            return direct(*args, **kwargs)

        def partition(*args, **kwargs):
            self.releases[id(param)] = self.releases.get(id(param), 0) + 1
            return part(*args, **kwargs)

        param.all_gather, param.partition = all_gather, partition


def own_width(batch):
    """``batch`` cut to its own longest completion, as ``build_batch`` pads a rank's rows: ranks then differ in width."""
    from dataclasses import fields, replace

    P, C = batch.prompt_width, batch.loss_mask.shape[1]
    keep = int(batch.loss_mask.sum(1).max())
    cut = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] in (P + C, C):
            cut[f.name] = v[:, : (P + keep if v.shape[1] == P + C else keep)]
    return replace(batch, **cut)


def counted_steps(counter: GatherCounter, chunk: int | None, ragged: bool = False):
    """``two_steps`` that also records, per micro-batch, the gathers of the policy's and the reference's head weight
    in the forward (from the micro-batch's forward to its backward) and in the backward. ``ragged``: each rank's rows
    cut to their own width (``own_width``), so the ranks' micro-batches have different numbers of chunks."""

    def step(backend, cfg, dist, rows: slice) -> dict:
        from pods.models import unwrap

        head = unwrap(backend.engine).get_output_embeddings().weight
        ref_head = unwrap(backend.ref).get_output_embeddings().weight
        counter.watch(head)
        per_mb: list[dict] = []
        forward_stats, backward = backend.forward_stats, backend.backward

        def snap() -> tuple[int, int]:
            return counter.gathers.get(id(head), 0), counter.gathers.get(id(ref_head), 0)

        def fwd(mb, entropy=False):
            n = mb.loss_mask.numel()
            per_mb.append({"chunks": math.ceil(n / chunk) if chunk else 1, "start": snap(), "released": counter.releases.get(id(head), 0)})
            return forward_stats(mb, entropy)

        def bwd(loss):
            rec = per_mb[-1]
            rec["mid"] = snap()
            backward(loss)
            rec["end"], rec["released"] = snap(), counter.releases.get(id(head), 0) - rec["released"]

        backend.forward_stats, backend.backward = fwd, bwd
        batches = [fixed_batch(i).rows(rows.start, rows.stop) for i in range(len(EQUIV_LRS))]
        batches = [own_width(b) for b in batches] if ragged else batches
        stats = [backend.update(b, lr, mbs) for b, lr, mbs in zip(batches, EQUIV_LRS, MICRO)]
        counts = [
            {
                "chunks": r["chunks"],
                "forward": r["mid"][0] - r["start"][0],
                "backward": r["end"][0] - r["mid"][0],
                "released": r["released"],
                "ref": r["mid"][1] - r["start"][1],
            }
            for r in per_mb
        ]
        extra = {"prefetched": counter.prefetched, "invalidated": counter.invalidated}
        persisted = sorted(n for n, p in unwrap(backend.engine).named_parameters() if p.ds_persist)
        return {
            "stats": [dist.reduce_metrics(s) for s in stats],
            "counts": dist.gather_object(counts),
            "extra": dist.gather_object(extra),
            "persisted": persisted,
            "vectors": sorted(n for n, p in unwrap(backend.engine).named_parameters() if len(p.ds_shape) == 1),
        }

    return step


def plain_steps(backend, cfg, dist, rows: slice) -> dict:
    return {"stats": [backend.update(fixed_batch(i).rows(rows.start, rows.stop), lr) for i, lr in enumerate(EQUIV_LRS)]}


def worker(out: Path) -> None:
    counter = GatherCounter()
    counter.install()
    for name, chunk, ragged in VARIANTS:
        counter.reset()
        on_two_ranks(counted_steps(counter, chunk, ragged), overrides(chunk), out, name)


# ----------------------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------------------
def test_the_gpu_profile_keeps_deepspeeds_zero3_sizes():
    """What ``GPU_ZERO_DEFAULTS`` stands for: h100x8_zero3 sets none of these sizes, and they are DeepSpeed's defaults."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from pods.backends.deepspeed import ds_config
    from pods.schema import check
    from support.config import compose

    typed = check(compose(["hardware=h100x8_zero3"]))
    zero = ds_config(typed.hardware, typed.optim)["zero_optimization"]
    assert zero["overlap_comm"] is True and not set(zero) & {*GPU_ZERO_DEFAULTS, "stage3_param_persistence_threshold"}
    defaults = DeepSpeedZeroConfig(stage=3)
    assert defaults.prefetch_bucket_size == 5e7 and defaults.param_persistence_threshold == 1e5
    assert defaults.max_live_parameters == defaults.max_reuse_distance == defaults.sub_group_size == 1e9
    assert defaults.reduce_bucket_size == 5e8


@pytest.fixture(scope="module")
def worker_run(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ds_chunks")
    torchrun([str(Path(__file__)), str(out)], out / "worker.log", timeout=600)
    return {name: torch.load(out / f"{name}.pt", weights_only=False) for name, _, _ in VARIANTS}


@pytest.fixture(scope="module")
def local_run(tiny_dir):
    """The single-process reference: LocalBackend, float32, the whole 8-sequence batch in micro-batches of 3, one chunk."""
    return in_one_process(tiny_dir, plain_steps, EQUIV)


@pytest.mark.slow
def test_zero3_settings_prefetch_and_release_as_on_the_gpu(worker_run):
    for name, run in worker_run.items():
        assert run["persisted"] == run["vectors"], f"{name}: persisted = the 1-D parameters, as 1e5 does on Qwen2.5-3B"
        for extra in run["extra"]:
            assert extra["prefetched"] > 0, f"{name}: nothing was prefetched"
        for rank in run["counts"]:
            assert all(c["released"] >= 1 for c in rank), f"{name}: the head weight was never released in a micro-batch"
    assert all(c["chunks"] >= 3 for rank in worker_run["chunks"]["counts"] for c in rank)
    chunks = [[c["chunks"] for c in rank] for rank in worker_run["ragged"]["counts"]]
    assert chunks[0] != chunks[1] and min(min(chunks)) >= 2, chunks  # the ranks' chunk counts differ in every micro-batch


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["chunks", "ragged"])
def test_several_chunks_gather_the_head_as_often_as_one_chunk(worker_run, variant):
    """The tied head weight is gathered once per micro-batch for the whole chunk loop, forward and backward: the
    same number of all-gathers as with one chunk (the embedding's own gathers and the model's 1-row head included)."""
    many, one = worker_run[variant], worker_run["one_chunk"]
    print(f"\n{variant}: head all-gathers per micro-batch, rank 0:", many["counts"][0], "\none chunk:", one["counts"][0])
    for rank in (0, 1):
        for a, b in zip(many["counts"][rank], one["counts"][rank], strict=True):
            assert (a["forward"], a["backward"], a["ref"]) == (b["forward"], b["backward"], b["ref"]), (rank, a, b)
    # the module order DeepSpeed traces no longer depends on the chunk count: never re-traced (prefetch stays on)
    assert [e["invalidated"] for e in many["extra"]] == [0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["chunks", "ragged"])
def test_several_chunks_equal_one_chunk_and_one_process(worker_run, local_run, variant):
    many, one = worker_run[variant], worker_run["one_chunk"]
    # Several chunks vs one chunk on the same 2 ranks, measured (chunks / ragged): weights 1.4e-7 / 2.6e-7; relative
    # grad norm, loss, KL at step 1 3e-10, 0 / 1.2e-9, 5.2e-8, at step 2 7.7e-7, 5.0e-7, 4.9e-7 / 2.5e-6, 9.8e-7, 9.8e-7
    # (the chunks' and the cut widths' matmul shapes change the float32 reduction order).
    assert_two_ranks_equal_one(many, one, weights_tol=2e-6, grad_rel=(5e-7, 2e-5), keys=("grad_norm", "loss", "kl"))
    # 2 ranks vs 1 process, the tolerances of tests/distributed/test_deepspeed_on_cpu.py; measured here (chunks, ragged, one chunk):
    # weights 2.3e-6 to 2.4e-6, relative grad norm 2.8e-6 / 3.0e-5, loss 1e-7 / 7.8e-6, KL 8.2e-6 at steps 1 / 2.
    for run in (many, one):
        assert_two_ranks_equal_one(run, local_run, weights_tol=1e-5, grad_rel=(1e-5, 1e-4), keys=("grad_norm", "loss", "kl"))
    assert weight_gap(local_run["weights"], local_run["start"]) > 0.05, "the two steps barely moved the weights"


if __name__ == "__main__":  # torchrun ... tests/distributed/test_deepspeed_chunks_on_cpu.py OUT_DIR
    worker(Path(sys.argv[1]))
