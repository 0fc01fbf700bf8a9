"""Compressed-KV engine (rollout=sparse_hf): equals the dense HF engine when the budget holds everything; with a
small budget the cache never exceeds it and the sampler log-probs are those of the model run with exactly the
kept positions (an independent full forward with an explicit attention mask); eviction policies by hand."""

from __future__ import annotations

import pytest
import torch

from pods.engines import ENGINES, Sampling
from pods.engines.kv_policies import KV_POLICIES
from pods.engines.sparse_hf import check_settings
from pods.models import load_tokenizer
from pods.schema import HfRollout, SparseHfRollout, complete
from support.harness import max_gap, within


@pytest.fixture(scope="module")
def model_tok(tiny_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32, attn_implementation="eager"), load_tokenizer(tiny_dir)


def _prompts(tok, k=3):
    msgs = [
        [{"role": "user", "content": f"What is {a} + {b}? Answer in format: 'Answer: {{result}}'"}]
        for a, b in [(12, 34), (56, 7), (99, 99)][:k]
    ]
    return [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)) for m in msgs]


def test_large_budget_equals_dense_hf_engine(model_tok, tiny_dir):
    model, tok = model_tok
    prompts = _prompts(tok)
    s = Sampling(temperature=0.0, max_tokens=20)
    dense = ENGINES.get("hf")(tiny_dir, tok, complete(HfRollout, name="hf"), policy=model).generate(prompts, 2, s)
    for method in ("sink_window", "snapkv", "rkv"):
        sparse = ENGINES.get("sparse_hf")(
            tiny_dir, tok, complete(SparseHfRollout, name="sparse_hf", method=method, budget=512, interval=16), policy=model
        ).generate(prompts, 2, s)
        assert sparse.completion_ids == dense.completion_ids
        for a, b in zip(sparse.logprobs, dense.logprobs):
            within(max_gap(torch.tensor(a), torch.tensor(b)), 1e-4, f"{method} with a budget above the length vs dense")
        assert sparse.metrics["kv_bytes_sparse"] == pytest.approx(sparse.metrics["kv_bytes_dense"])


def _masked_logprob(model, seq: list[int], P: int, visible: list[torch.Tensor], T: float) -> float:
    """log p(seq[-1]) from one full forward with an explicit mask: prompt rows are causal, the row of the token
    decoded at position P + i sees only ``visible[i]`` (absolute positions), as the compressed cache did."""
    L = len(seq) - 1
    mask = torch.full((1, 1, L, L), float("-inf")).triu(1)
    for i, kept in enumerate(visible):
        mask[0, 0, P + i] = float("-inf")
        mask[0, 0, P + i, kept] = 0.0
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq[:-1]]), attention_mask=mask).logits[0, -1].float() / T
    return float(logits.log_softmax(-1)[seq[-1]])


def _first_two_then_recent(L: int, n_kept: int) -> list[int]:
    """A query-free rule by hand (sink=2): every position while they fit, else the first 2 plus the most recent."""
    return list(range(L)) if n_kept == L else [0, 1] + list(range(L - (n_kept - 2), L))


@pytest.mark.parametrize("method, by_hand", [("sink_window", _first_two_then_recent), ("snapkv", None)])
def test_small_budget_bounds_the_cache_and_logprobs_match_the_kept_cache(model_tok, tiny_dir, method, by_hand):
    """``by_hand``: the kept positions from the length alone, for a policy that reads no queries (None: it does)."""
    assert KV_POLICIES.spec(method).needs_queries is (by_hand is None)
    model, tok = model_tok
    prompts = _prompts(tok, 1)
    P = len(prompts[0])
    budget, interval = P + 2, 2
    eng = ENGINES.get("sparse_hf")(
        tiny_dir,
        tok,
        complete(SparseHfRollout, name="sparse_hf", method=method, budget=budget, interval=interval, window=4, sink=2),
        policy=model,
    )
    eng.record = True
    for seed in range(20):  # the first sample longer than 4 tokens (the tiny model often answers in 3): compression happened
        torch.manual_seed(seed)
        eng.kept_log = []
        ro = eng.generate(prompts, 1, Sampling(temperature=1.0, max_tokens=24, stop=[]))
        if len(ro.completion_ids[0]) > 4:
            break
    comp, lps = ro.completion_ids[0], ro.logprobs[0]
    assert len(comp) > 4
    assert all(k[0].shape[1] <= budget for k in eng.kept_log)  # every layer's cache, every step
    assert ro.metrics["kv_bytes_sparse"] < ro.metrics["kv_bytes_dense"]
    for t in range(1, len(comp)):
        kept = eng.kept_log[t - 1][0][0]  # layer 0, row 0: positions visible to the query decoding token t
        if by_hand is not None:  # independent rule: the positions follow from the length
            n_kept, L = len(kept), P + t
            assert kept.tolist() == by_hand(L, n_kept)
            assert n_kept == L or n_kept > budget - interval
        # one mask serves every layer when all layers kept the same sets so far (always for a query-free policy)
        if all(torch.equal(k[li][0], k[0][0]) for k in eng.kept_log[:t] for li in range(len(k))):
            visible = [eng.kept_log[i][0][0] for i in range(t)]
            assert _masked_logprob(model, prompts[0] + comp[: t + 1], P, visible, 1.0) == pytest.approx(lps[t], abs=1e-4)


def test_policies_by_hand():
    c = complete(SparseHfRollout, name="sparse_hf", sink=2, window=2, kernel=1, mix_alpha=0.1, sim_threshold=0.5)
    keys = torch.randn(1, 1, 10, 4)
    assert KV_POLICIES.get("sink_window")(keys, None, 5, c)[0].tolist() == [0, 1, 7, 8, 9]
    # snapkv: the window query points at position 3 only -> 3 is kept with the 2-token window
    keys = torch.zeros(1, 1, 10, 4)
    keys[0, 0, 3] = torch.tensor([10.0, 0, 0, 0])
    q = torch.tensor([1.0, 0, 0, 0]).view(1, 1, 1, 4).expand(1, 1, 2, 4)
    assert KV_POLICIES.get("snapkv")(keys, q, 3, c)[0].tolist() == [3, 8, 9]


def test_bad_budget_is_named():
    with pytest.raises(ValueError, match="rollout.budget"):
        check_settings(complete(SparseHfRollout, name="sparse_hf", method="snapkv", budget=16, interval=10, window=8))
    # sink_window always keeps its sink, not a window: the same budget leaves room above 4 sink positions
    sink = {"name": "sparse_hf", "method": "sink_window", "budget": 16, "interval": 10}
    assert check_settings(complete(SparseHfRollout, **sink, window=8, sink=4)).budget == 16
    with pytest.raises(ValueError, match="must exceed 6"):
        check_settings(complete(SparseHfRollout, **sink, window=2, sink=6))
    with pytest.raises(ValueError, match="unknown KV compression method"):
        check_settings(complete(SparseHfRollout, name="sparse_hf", method="nope"))
