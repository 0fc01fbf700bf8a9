"""The compressed-KV engine's release-regime options and its padded batches, on the tiny model:

- ``pad``: prompts of different lengths in one left-padded batch decode the same greedy tokens as batches of equal
  length (no padding), with log-probs within 5e-4 (float32: the padded attention and batch shapes sum in another order; measured up to 1.4e-4), for every
  option combination below;
- ``keep_prompt``: every prompt position stays cached, at most ``budget`` decoded ones;
- ``cadence: steps`` + ``compress_after``: compressions only at every ``interval``-th decoding step once the sequence
  is longer than ``compress_after``, and never at the prefill;
- ``shared_set``: every layer holds the same positions (a per-layer query policy otherwise differs between layers);
- bad values: one-line errors naming the key.
"""

from __future__ import annotations

import pytest
import torch

from pods.engines import ENGINES, Sampling
from pods.errors import ConfigError
from pods.models import load_tokenizer
from pods.schema import SparseHfRollout, complete

CONFIGS = {
    "sink_window": dict(method="sink_window", budget=40, interval=4, sink=4),
    "snapkv": dict(method="snapkv", budget=40, interval=8, window=4, kernel=3),
    "rkv keep_prompt": dict(method="rkv", budget=10, interval=2, window=4, keep_prompt=True),
    "snapkv steps shared": dict(method="snapkv", budget=44, interval=4, window=4, cadence="steps", compress_after=44, shared_set=True),
}


@pytest.fixture(scope="module")
def model_tok(tiny_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), load_tokenizer(tiny_dir)


def _prompts(tok) -> list[list[int]]:
    """Six chat prompts of 4 different lengths, shortest first (the engine's batch order: ``kept_log`` rows follow it)."""
    qs = ["What is 1 + 2?", "What is 12 + 34? Answer briefly.", "Add 99 and 99, then add 7 to the sum.", "What is 5 + 5?"]
    qs += ["Compute 123 + 456 + 789 and give the answer as 'Answer: N'.", "What is 12 + 34? Answer briefly."]
    msgs = [[{"role": "user", "content": q}] for q in qs]
    return sorted((list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)) for m in msgs), key=len)


def _engine(model, tok, tiny_dir, **kw):
    return ENGINES.get("sparse_hf")(tiny_dir, tok, complete(SparseHfRollout, name="sparse_hf", **kw), policy=model)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_padded_batch_equals_equal_length_batches(model_tok, tiny_dir, name):
    model, tok = model_tok
    prompts = _prompts(tok)
    assert len({len(p) for p in prompts}) == 4
    s = Sampling(temperature=0.0, max_tokens=40, stop=[])
    out = {}
    for pad in (False, True):
        eng = _engine(model, tok, tiny_dir, pad=pad, **CONFIGS[name])
        eng.stop_ids = set()  # decode all 40 tokens: every row compresses several times
        out[pad] = eng.generate(prompts, 2, s)
    assert out[True].completion_ids == out[False].completion_ids
    assert all(len(c) == 40 for c in out[True].completion_ids)
    gap = max(abs(a - b) for x, y in zip(out[True].logprobs, out[False].logprobs) for a, b in zip(x, y))
    assert gap < 5e-4, f"{name}: padded vs unpadded log-probs differ by {gap}"
    print(f"{name}: max |padded - unpadded| log-prob {gap:.2e}")
    assert out[True].metrics == pytest.approx(out[False].metrics)
    assert out[True].metrics["kv_saving"] > 0.1  # compression happened


def _record(model, tok, tiny_dir, prompts, **kw):
    eng = _engine(model, tok, tiny_dir, pad=True, **kw)
    eng.stop_ids, eng.record = set(), True
    eng.generate(prompts, 1, Sampling(temperature=1.0, max_tokens=30, seed=3))
    return eng.kept_log  # per fed token t: per layer [B, L] absolute positions (-1: padding)


def test_keep_prompt_never_evicts_the_prompt(model_tok, tiny_dir):
    model, tok = model_tok
    prompts = _prompts(tok)
    log = _record(model, tok, tiny_dir, prompts, method="snapkv", budget=8, interval=2, window=4, keep_prompt=True)
    for t, layers in enumerate(log):
        for kept in layers:
            for b, p in enumerate(prompts):
                row = kept[b][kept[b] >= 0].tolist()
                assert row[: len(p)] == list(range(len(p)))  # the whole prompt, first
                d = len(row) - len(p)  # decoded positions held: t + 1 until the budget, then between a cut's 7 and 8
                assert d == t + 1 if t < 8 else 6 < d <= 8


def test_steps_cadence_compresses_every_interval_after_the_threshold(model_tok, tiny_dir):
    model, tok = model_tok
    prompts = _prompts(tok)
    after, interval = 40, 4
    log = _record(model, tok, tiny_dir, prompts, method="sink_window", budget=36, interval=interval, cadence="steps", compress_after=after)
    for b, p in enumerate(prompts):
        sizes = [int((layers[0][b] >= 0).sum()) for layers in log]  # cached entries after feeding token t
        for t in range(1, len(sizes)):
            cut = sizes[t] <= sizes[t - 1]
            assert cut == ((t + 1) % interval == 0 and len(p) + t + 1 > after), (b, t, sizes)
            if cut:
                assert sizes[t] == 36 - interval + 1
        assert sizes[0] == len(p) + 1  # the prefill is never compressed


def test_shared_set_holds_the_same_positions_in_every_layer(model_tok, tiny_dir):
    model, tok = model_tok
    prompts = _prompts(tok)
    kw = dict(method="snapkv", budget=24, interval=4, window=4)
    per_layer = _record(model, tok, tiny_dir, prompts, **kw)
    assert any(not torch.equal(layers[0], layers[-1]) for layers in per_layer)  # the check below could fail
    for layers in _record(model, tok, tiny_dir, prompts, shared_set=True, **kw):
        assert all(torch.equal(k, layers[0]) for k in layers)


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"cadence": "often"}, "rollout.cadence"),
        ({"compress_after": -1}, "rollout.compress_after"),
        ({"keep_prompt": "maybe"}, "rollout.keep_prompt"),
    ],
)
def test_bad_values_are_one_line_errors(bad, key):
    with pytest.raises(ConfigError, match=key) as e:
        SparseHfRollout.of({"name": "sparse_hf", **bad})
    assert "\n" not in str(e.value)
