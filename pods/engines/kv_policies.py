"""KV-cache eviction policies for compressed-cache rollouts (Sparse-RL's sparse sampler), by name.

A policy picks which cached positions of one layer survive a compression:
``fn(keys [B, H_kv, L, D], queries [B, H_q, w, D] | None, keep: int, c: SparseHfRollout) -> idx [B, keep]`` (sorted
indices into the L cached entries; the same set for every head of the layer, as in the authors' SGLang
code). ``queries`` are the post-RoPE queries of the last ``c.window`` decoded tokens (only for policies whose
``KvSpec`` says ``needs_queries``; None otherwise). Values of the constants: docs/sparse-rl.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pods.registry import Registry
from pods.schema import SparseHfRollout


@dataclass(frozen=True)
class KvSpec:
    """What a KV policy needs of the engine (registered with it: ``KV_POLICIES.spec(name)``)."""

    needs_queries: bool = False  # the engine hooks the attention to record the last ``window`` decoded queries
    always_kept: str = "window"  # the rollout key counting the positions every compression keeps (budget must exceed it)


KV_POLICIES = Registry("KV compression method", spec=KvSpec)
_WINDOWED = KvSpec(needs_queries=True)  # observation-window policies: they score positions with the recent queries


@KV_POLICIES.register("sink_window", spec=KvSpec(always_kept="sink"))
def sink_window(keys, queries, keep: int, c: SparseHfRollout) -> torch.Tensor:
    """StreamingLLM: the first ``sink`` positions plus the most recent ``keep - sink``."""
    B, L = keys.shape[0], keys.shape[2]
    sink = int(c.sink)
    idx = torch.cat([torch.arange(sink), torch.arange(L - (keep - sink), L)])
    return idx.unsqueeze(0).expand(B, -1).to(keys.device)


def _window_attention(keys, queries, w: int) -> torch.Tensor:
    """Observation-window attention on the older positions: [B, H_kv, L - w], softmax over them, mean over the
    w queries, max over the query heads that share a KV head (the authors' ``attn_pooling="max"``)."""
    B, Hk, L, D = keys.shape
    Hq = queries.shape[1]
    q = queries[:, :, -w:].reshape(B, Hk, Hq // Hk, -1, D)
    logits = torch.einsum("bkgwd,bkld->bkgwl", q.float(), keys.float()) / D**0.5
    logits = logits.max(dim=2).values[..., : L - w]  # [B, H_kv, w, L - w]
    return logits.softmax(dim=-1).mean(dim=-2)


def _select(score: torch.Tensor, L: int, keep: int, w: int) -> torch.Tensor:
    """Top ``keep - w`` older positions by ``score`` [B, L - w] plus the last w, sorted."""
    top = score.topk(keep - w, dim=-1).indices
    recent = torch.arange(L - w, L, device=score.device).unsqueeze(0).expand(score.shape[0], -1)
    return torch.cat([top, recent], dim=1).sort(dim=1).values


@KV_POLICIES.register("snapkv", spec=_WINDOWED)
def snapkv(keys, queries, keep: int, c: SparseHfRollout) -> torch.Tensor:
    """SnapKV: window attention, max-pooled over ``kernel`` neighbours, summed over heads; keep the top positions."""
    w, kernel = int(c.window), int(c.kernel)
    attn = F.max_pool1d(_window_attention(keys, queries, w), kernel_size=kernel, padding=kernel // 2, stride=1)
    return _select(attn.sum(dim=1), keys.shape[2], keep, w)


def _redundancy(keys: torch.Tensor, threshold: float) -> torch.Tensor:
    """R-KV's key redundancy [B, H_kv, L]: mean cosine similarity of each key to the others (each row's most
    recent above-``threshold`` match removed, so the latest copy counts as unique), softmax over positions."""
    kn = keys.float() / (keys.float().norm(dim=-1, keepdim=True) + 1e-8)
    sim = kn @ kn.transpose(-1, -2)
    L = sim.shape[-1]
    sim = sim * (1 - torch.eye(L, device=sim.device))
    pos = torch.arange(L, device=sim.device).expand_as(sim)
    last = torch.where(sim > threshold, pos, torch.zeros_like(pos)).max(dim=-1, keepdim=True).values
    sim = sim.scatter(-1, last, 0.0)
    return sim.mean(dim=-2).softmax(dim=-1)


@KV_POLICIES.register("rkv", spec=_WINDOWED)
def rkv(keys, queries, keep: int, c: SparseHfRollout) -> torch.Tensor:
    """R-KV: alpha * pooled window attention - (1 - alpha) * key redundancy, summed over heads."""
    w, kernel, alpha = int(c.window), int(c.kernel), float(c.mix_alpha)
    attn = F.max_pool1d(_window_attention(keys, queries, w), kernel_size=kernel, padding=kernel // 2, stride=1)
    red = _redundancy(keys, float(c.sim_threshold))[..., : keys.shape[2] - w]
    return _select((alpha * attn - (1 - alpha) * red).sum(dim=1), keys.shape[2], keep, w)
