"""The compressed engine's two KV measures against a count by hand (rollout=sparse_hf, the tiny model, no stop token
so every sequence decodes exactly ``max_tokens``).

Hand case: prompts of 5 and 8 tokens, 8 decoded tokens each, ``budget`` 10, ``interval`` 2 (a cut keeps 8 entries),
``compress_after`` 12. The KV entries per layer held by the forward that produced each decoded token:
- 5-token prompt: 5 6 7 8 9 10 11 12 (the sequence never passes 12 tokens before the last forward: never cut), sum 68
  = the dense count 5 + ... + 12;
- 8-token prompt: 8 9 10 11 12, cut to 8 before feeding its 5th token (13 tokens > 12) -> 9, 10, cut again -> 9:
  8 9 10 11 12 9 10 9, sum 78 against the dense 8 + ... + 15 = 92.
Aggregate saving 1 - (68 + 78) / (68 + 92) = 0.0875 with half of the rollouts ever compressed, while the peak per
sequence gives 1 - (12 + 12) / (12 + 15) = 0.111: the two measures differ, and each is checked exactly.
"""

from __future__ import annotations

import pytest
import torch

from pods.engines import ENGINES, Sampling
from pods.engines.sparse_hf import dense_token_steps
from pods.models import load_tokenizer
from pods.schema import SparseHfRollout, complete


@pytest.fixture(scope="module")
def model_tok(tiny_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), load_tokenizer(tiny_dir)


def _generate(model_tok, tiny_dir, prompts, max_tokens=8, **kw):
    model, tok = model_tok
    cfg = complete(SparseHfRollout, name="sparse_hf", method="sink_window", sink=1, **({"budget": 10, "interval": 2} | kw))
    eng = ENGINES.get("sparse_hf")(tiny_dir, tok, cfg, policy=model)
    eng.stop_ids = set()  # every sequence runs to max_tokens: the lengths of the hand count
    return eng.generate(prompts, 1, Sampling(temperature=1.0, max_tokens=max_tokens, seed=0))


def test_dense_token_steps_by_brute_force():
    for p in range(1, 6):
        for c in range(0, 7):
            assert dense_token_steps(p, c) == sum(p + i for i in range(c))


@pytest.mark.parametrize("pad", [False, True])
def test_both_kv_measures_match_the_hand_count(model_tok, tiny_dir, pad):
    prompts = [list(range(3, 8)), list(range(3, 11))]  # 5 and 8 tokens
    m = _generate(model_tok, tiny_dir, prompts, compress_after=12, pad=pad).metrics
    assert m["kv_token_steps_dense"] == 68 + 92
    assert m["kv_token_steps_sparse"] == 68 + 78
    assert m["kv_saving_token_steps"] == pytest.approx(1 - 146 / 160)
    assert m["kv_compressed_frac"] == 0.5
    assert m["kv_saving"] == pytest.approx(1 - 24 / 27)  # the peak per sequence, unchanged


def test_no_compression_saves_nothing_on_either_measure(model_tok, tiny_dir):
    m = _generate(model_tok, tiny_dir, [list(range(3, 8))], compress_after=100).metrics
    assert m["kv_token_steps_sparse"] == m["kv_token_steps_dense"] == 68
    assert m["kv_saving_token_steps"] == 0 and m["kv_compressed_frac"] == 0 and m["kv_saving"] == 0


def _script(name: str):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_release_schedule_script_counts_what_the_engine_counts(model_tok, tiny_dir):
    """scripts/sparse_rl_release_kv.py's schedule (the release's ``cadence: steps``) against the engine's own count:
    prompts of 5 and 8 tokens, 40 decoded each, cut to 8 entries every 8th step once the sequence passes 12 tokens."""
    rel = _script("sparse_rl_release_kv")
    prompts = [list(range(3, 8)), list(range(3, 11))]
    m = _generate(model_tok, tiny_dir, prompts, cadence="steps", compress_after=12, max_tokens=40, budget=16, interval=8).metrics
    want = rel.measures([5, 8], [40, 40], 16, 8, 12)
    assert m["kv_saving_token_steps"] == pytest.approx(want["kv_saving_token_steps"])
    assert m["kv_saving"] == pytest.approx(want["kv_saving_peak"]) and m["kv_compressed_frac"] == want["compressed_frac"] == 1
    sizes, cut = rel.cache_sizes(8, 40, 16, 8, 12)
    assert cut and max(sizes) == 16 and sum(sizes) < sum(range(8, 48))
    assert rel.cache_sizes(5, 8, 16, 8, 12) == (list(range(5, 13)), False)  # 12 tokens at most: never cut
