"""Compressed-KV rollouts with the live policy (``rollout=sparse_hf``): Sparse-RL's sparse sampler.

A hand-written decode loop over transformers' ``DynamicCache``: once the cache of a sequence would exceed
``budget`` tokens, each layer's cache is cut to ``budget - interval`` positions chosen by the named eviction
policy (``pods.engines.kv_policies``), so the attention never sees more than ``budget`` keys and a compression
runs every ``interval`` decoding steps. Keys are cached after RoPE, so a survivor keeps its true position and
new tokens get their absolute positions. Prompts are grouped by length (no padding inside a batch), so every
row of a batch holds the same number of entries per layer. The prompt is prefilled densely (as in the
authors' SGLang code); a prompt longer than the budget is compressed before the first decoded token.

Returned log-probs are the SAMPLER's: log softmax(logits / T) of the compressed-cache forward. Metrics:
``kv_bytes_dense`` / ``kv_bytes_sparse`` = mean over the step's sequences of the peak KV bytes per sequence
(all layers, keys + values) with a full cache / with this engine's cache; ``kv_saving`` = 1 - sparse / dense.
"""

from __future__ import annotations

import torch

from pods.engines.base import PolicyEngine, Rollouts, Sampling
from pods.engines.kv_policies import KV_POLICIES
from pods.errors import ConfigError
from pods.models import unwrap
from pods.progress import bar
from pods.schema import SparseHfRollout


def check_settings(c: SparseHfRollout) -> SparseHfRollout:
    """The engine's settings checked across keys; a bad value raises ValueError naming the key."""
    floor = getattr(c, KV_POLICIES.spec(c.method).always_kept)  # sink for sink_window, window for the query policies
    if not c.interval >= 1 or c.budget - c.interval <= floor:
        raise ValueError(
            f"rollout.budget - rollout.interval must exceed {floor} (the always-kept positions): got {c.budget} - {c.interval}"
        )
    return c


def _sample(logits: torch.Tensor, s: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] and their log-probs under softmax(logits / T) (T = 1 when greedy), untruncated."""
    greedy = s.temperature <= 0
    scaled = logits.float() / (1.0 if greedy else s.temperature)
    logp = scaled.log_softmax(-1)
    if greedy:
        tok = scaled.argmax(-1)
    else:
        probs = logp.exp()
        if s.top_k > 0:
            kth = probs.topk(min(s.top_k, probs.shape[-1]), dim=-1).values[:, -1:]
            probs = probs * (probs >= kth)
        if s.top_p < 1.0:
            sp, si = probs.sort(dim=-1, descending=True)
            drop = sp.cumsum(-1) - sp > s.top_p * sp.sum(-1, keepdim=True)
            probs = probs.scatter(-1, si, sp * ~drop)
        tok = torch.multinomial(probs, 1).squeeze(-1)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


class SparseHFEngine(PolicyEngine):
    """``rollout=sparse_hf``: the compressed-KV decode loop over ``rollout.max_batch`` equal-length prompts at a time."""

    section = SparseHfRollout
    label = "sparse_hf"

    def __init__(self, model_dir, tokenizer, cfg: SparseHfRollout, policy=None):
        super().__init__(model_dir, tokenizer, check_settings(cfg), policy)
        self.method = KV_POLICIES.get(self.cfg.method)
        self.max_batch = self.cfg.max_batch
        self.record = False  # tests set it: keep every step's kept positions
        self.kept_log: list = []

    @classmethod
    def check(cls, cfg) -> None:
        """The compression settings (``cfg``: the typed root): a known method, a budget above the always-kept positions."""
        try:
            check_settings(cfg.rollout)
        except ValueError as e:
            raise ConfigError(str(e).replace("unknown KV compression method", "rollout.method: unknown KV compression method")) from None

    @classmethod
    def gap_meaning(cls, cfg) -> tuple[str, str]:
        return "mismatch", "rollout=sparse_hf samples from a compressed KV cache: the gap is the sampler/trainer mismatch by design"

    @classmethod
    def kv_cache(cls, cfg):
        """At most ``max_batch`` sequences per batch, each holding at most max(budget, prompt) tokens."""
        ro = cfg.rollout
        return lambda seqs, prompt, completion: (min(ro.max_batch, seqs), max(ro.budget, prompt))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling, progress: bool = False) -> Rollouts:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        rows = [i for i in range(len(prompts)) for _ in range(n)]
        order = sorted(range(len(rows)), key=lambda j: len(prompts[rows[j]]))  # equal lengths batch together
        batches, cur = [], []
        for j in order:
            if cur and (len(cur) >= self.max_batch or len(prompts[rows[cur[0]]]) != len(prompts[rows[j]])):
                batches.append(cur)
                cur = []
            cur.append(j)
        batches += [cur] if cur else []
        out = [None] * len(rows)
        was_training = self.policy.training
        self.policy.eval()
        self.kept_log = []
        for b in bar(batches, desc="generate (sparse kv)", leave=False, disable=not progress):
            for j, res in zip(b, self._generate_rows([prompts[rows[j]] for j in b], sampling)):
                out[j] = res
        self.policy.train(was_training)
        ids, lps, reasons, dense, sparse = (list(x) for x in zip(*out))
        hf = unwrap(self.policy).config
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        per_token = 2 * hf.num_hidden_layers * kv_heads * head_dim * next(self.policy.parameters()).element_size()
        metrics = {"kv_bytes_dense": per_token * sum(dense) / len(dense), "kv_bytes_sparse": per_token * sum(sparse) / len(sparse)}
        metrics["kv_saving"] = 1 - metrics["kv_bytes_sparse"] / max(metrics["kv_bytes_dense"], 1e-9)
        texts = self.tok.batch_decode(ids, skip_special_tokens=True)
        return Rollouts(prompt_ids=prompts, completion_ids=ids, texts=texts, logprobs=lps, finish_reasons=reasons, n=n, metrics=metrics)

    def _query_hooks(self, model, queries: list):
        """Hooks that keep each layer's last ``window`` post-RoPE queries in ``queries[layer]``."""
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        w, handles = self.cfg.window, []
        for li, layer in enumerate(model.model.layers):
            attn = layer.self_attn

            def grab(module, args, kwargs, li=li):
                h = kwargs["hidden_states"]
                q = module.q_proj(h).view(*h.shape[:-1], -1, module.head_dim).transpose(1, 2)
                cos, sin = kwargs["position_embeddings"]
                q, _ = apply_rotary_pos_emb(q, q, cos, sin)
                queries[li] = q if queries[li] is None else torch.cat([queries[li], q], dim=2)[:, :, -w:]

            handles.append(attn.register_forward_pre_hook(grab, with_kwargs=True))
        return handles

    def _compress(self, cache, kept: list, queries: list) -> None:
        keep = self.cfg.budget - self.cfg.interval
        for li, layer in enumerate(cache.layers):
            idx = self.method(layer.keys, queries[li], keep, self.cfg)  # [B, keep]
            gi = idx[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, gi), layer.values.gather(2, gi)
            kept[li] = kept[li].gather(1, idx)

    def _generate_rows(self, prompts: list[list[int]], s: Sampling) -> list[tuple]:
        from transformers import DynamicCache

        model = unwrap(self.policy)
        device = next(self.policy.parameters()).device
        B, P = len(prompts), len(prompts[0])
        ids = torch.tensor(prompts, device=device)
        cache, queries = DynamicCache(), [None] * model.config.num_hidden_layers
        handles = self._query_hooks(model, queries) if KV_POLICIES.spec(self.cfg.method).needs_queries else []
        kept = [torch.arange(P, device=device).expand(B, -1) for _ in queries]  # absolute positions per layer
        toks, lps = [], []
        done = torch.zeros(B, dtype=torch.bool, device=device)
        peak = torch.full((B,), P, dtype=torch.long)
        try:
            logits = self.policy(input_ids=ids, position_ids=kept[0], past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            for t in range(s.max_tokens):
                tok, lp = _sample(logits, s)
                toks.append(tok)
                lps.append(lp)
                done |= torch.isin(tok, torch.tensor(sorted(self.stop_ids), device=device))
                if bool(done.all()) or t == s.max_tokens - 1:
                    break
                if cache.get_seq_length() + 1 > self.cfg.budget:
                    self._compress(cache, kept, queries)
                pos = torch.full((B, 1), P + t, device=device)
                kept = [torch.cat([k, pos], dim=1) for k in kept]
                if self.record:
                    self.kept_log.append([k.clone() for k in kept])
                logits = self.policy(input_ids=tok.unsqueeze(1), position_ids=pos, past_key_values=cache, use_cache=True).logits[:, -1]
                peak = torch.where(done.cpu(), peak, torch.maximum(peak, torch.tensor(cache.get_seq_length())))
        finally:
            for h in handles:
                h.remove()
        toks, lps = torch.stack(toks, 1).tolist(), torch.stack(lps, 1).tolist()
        out = []
        for b in range(B):
            end = next((i for i, x in enumerate(toks[b]) if x in self.stop_ids), None)
            keep = len(toks[b]) if end is None else end + 1
            out.append((toks[b][:keep], lps[b][:keep], "length" if end is None else "stop", P + keep - 1, int(peak[b])))
        return out
