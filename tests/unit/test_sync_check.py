"""The tallies behind the exact post-push check (pods.engines.vllm_sync): what vLLM does to the pushed tensors
(fusing q/k/v and gate/up, padding the vocabulary, transposing a packed weight) leaves them equal; a one-ulp change of
one bf16 weight, or a missing tensor, does not."""

from __future__ import annotations

import torch

from pods.engines import vllm_sync as vs


def test_fusion_padding_and_transposition_leave_the_tally_alone():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, 64, generator=g, dtype=torch.float64).to(torch.bfloat16) for s in (64, 16, 16))
    hf = vs.tally(q) + vs.tally(k) + vs.tally(v)
    fused = torch.cat([q, k, v])
    padded = torch.cat([fused, torch.zeros(8, 64, dtype=torch.bfloat16)])
    for engine_side in (fused, padded, fused.t().contiguous()):
        assert vs.agree(hf, vs.tally(engine_side))


def test_one_bf16_ulp_in_a_large_layer_is_seen():
    g = torch.Generator().manual_seed(1)
    w = (0.02 * torch.randn(4096, 1024, generator=g)).to(torch.bfloat16)
    stale = w.clone()
    stale.view(torch.int16)[7, 3] += 1  # one element, one bf16 ulp further from 0
    assert stale[7, 3] != w[7, 3]
    assert not vs.agree(vs.tally(w), vs.tally(stale))


def test_chunks_sum_to_the_whole(monkeypatch):
    x = torch.randn(1000, dtype=torch.float64)
    whole = vs.tally(x)
    monkeypatch.setattr(vs, "CHUNK", 7)
    assert torch.allclose(vs.tally(x), whole, rtol=1e-14, atol=0)
    assert torch.allclose(whole, torch.stack([x.sum(), x.abs().sum(), (x * x).sum()]))


def test_layers_named_and_checked():
    assert vs.layer_of("model.layers.12.mlp.down_proj.weight") == 12
    assert vs.layer_of("model.layers.3.") == 3 and vs.layer_of("model.norm.weight") is None
    assert vs.checked_layers(28) == [0, 27] and vs.checked_layers(1) == [0]
    sums: dict = {}
    tensors = [("model.layers.0.a", torch.ones(3)), ("model.layers.1.b", torch.ones(2)), ("model.layers.0.c", torch.ones(2))]
    assert list(vs.tallied(iter(tensors), [0], sums)) == tensors  # passed through unchanged
    assert sorted(sums) == [0] and sums[0].tolist() == [5.0, 5.0, 5.0]


def test_mismatch_names_the_first_wrong_or_missing_layer():
    one = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert vs.mismatch({0: one, 5: one}, {0: one.clone(), 5: one.clone()}) == ""
    assert vs.mismatch({0: one, 5: one}, {0: one, 5: one + 1e-9}).startswith("layer 5: pushed sum of squares 3")
    assert vs.mismatch({0: one}, {}).startswith("layer 0:")
