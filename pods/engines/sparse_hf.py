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
The aggregate over the whole batch (the count the release's figure most plausibly is, docs/sparse-rl.md):
``kv_token_steps_dense`` / ``kv_token_steps_sparse`` = the sum over sequences and decoded tokens of the KV entries
per layer held by the forward that produced the token (the prefill's for the first); ``kv_saving_token_steps`` =
1 - sparse / dense; ``kv_compressed_frac`` = the share of the step's sequences compressed at least once.
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
        """At most ``max_batch`` sequences per batch, each holding at most max(budget, prompt) tokens (``keep_prompt``:
        prompt + budget; ``cadence: steps`` may pass the budget by up to an interval before its first compression)."""
        ro = cfg.rollout
        if ro.keep_prompt:
            return lambda seqs, prompt, completion: (min(ro.max_batch, seqs), prompt + ro.budget)
        late = ro.interval if ro.cadence == "steps" else 0
        return lambda seqs, prompt, completion: (min(ro.max_batch, seqs), max(ro.budget, ro.compress_after + late, prompt + late))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling, progress: bool = False) -> Rollouts:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        rows = [i for i in range(len(prompts)) for _ in range(n)]
        lockstep = _zero3(self.policy)  # every forward gathers parameters from all ranks: same calls on every rank
        batches = self._batches([len(prompts[i]) for i in rows], pad=self.cfg.pad or lockstep)
        if lockstep:  # as many batches on every rank; a rank with fewer decodes a filler batch and drops it
            batches += [None] * (_all_ranks(len(batches), torch.distributed.ReduceOp.MAX, self.policy) - len(batches))
        out = [None] * len(rows)
        was_training = self.policy.training
        self.policy.eval()
        self.kept_log = []
        for b in bar(batches, desc="generate (sparse kv)", leave=False, disable=not progress):
            batch = [prompts[rows[j]] for j in b] if b is not None else [prompts[0] if prompts else [self.tok.eos_token_id or 0]]
            for j, res in zip(b or [], self._generate_rows(batch, sampling, lockstep)):
                out[j] = res
        self.policy.train(was_training)
        ids, lps, reasons, dense, sparse, held, cut = (list(x) for x in zip(*out)) if out else ([],) * 7
        hf = unwrap(self.policy).config
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        per_token = 2 * hf.num_hidden_layers * kv_heads * head_dim * next(self.policy.parameters()).element_size()
        metrics = {
            "kv_bytes_dense": per_token * sum(dense) / max(len(dense), 1),
            "kv_bytes_sparse": per_token * sum(sparse) / max(len(sparse), 1),
        }
        metrics["kv_saving"] = 1 - metrics["kv_bytes_sparse"] / max(metrics["kv_bytes_dense"], 1e-9)
        full = sum(dense_token_steps(len(prompts[rows[j]]), len(ids[j])) for j in range(len(ids)))
        metrics |= {"kv_token_steps_dense": float(full), "kv_token_steps_sparse": float(sum(held))}
        metrics["kv_saving_token_steps"] = 1 - sum(held) / max(full, 1)
        metrics["kv_compressed_frac"] = sum(cut) / max(len(cut), 1)
        texts = self.tok.batch_decode(ids, skip_special_tokens=True)
        return Rollouts(prompt_ids=prompts, completion_ids=ids, texts=texts, logprobs=lps, finish_reasons=reasons, n=n, metrics=metrics)

    def _batches(self, lengths: list[int], pad: bool) -> list[list[int]]:
        """Row indices by prompt length, at most ``max_batch`` per batch; without ``pad`` only equal lengths together."""
        batches, cur = [], []
        for j in sorted(range(len(lengths)), key=lambda j: lengths[j]):
            if cur and (len(cur) >= self.max_batch or (not pad and lengths[cur[0]] != lengths[j])):
                batches.append(cur)
                cur = []
            cur.append(j)
        return batches + ([cur] if cur else [])

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

    def _due(self, n: torch.Tensor, base: torch.Tensor, p: torch.Tensor, t: int) -> torch.Tensor:
        """Rows [B] bool to compress before feeding decoded token t: ``n`` [B] cached entries, ``base`` [B] of them never
        evicted (the prompt under ``keep_prompt``), ``p`` [B] prompt lengths. The counted entries c = n - base."""
        c, cfg = n - base, self.cfg
        due = c + 1 > cfg.budget if cfg.cadence == "budget" else torch.full_like(c, (t + 1) % cfg.interval == 0, dtype=torch.bool)
        length = t + 1 + (0 if cfg.keep_prompt else p)  # the sequence once token t is fed (decoded tokens only under keep_prompt)
        return due & (length > cfg.compress_after) & (c > cfg.budget - cfg.interval)

    def _compress(self, cache, kept: list, queries: list, n: torch.Tensor, base: torch.Tensor, due: torch.Tensor) -> torch.Tensor:
        """Cut the ``due`` rows to ``base + budget - interval`` entries, in place; the new ``n`` [B].

        Row b's n[b] entries sit right-aligned in every layer's keys / values [B, H_kv, L, D] (padding on the left);
        the policy scores the last n[b] - base[b] of them (rows of equal (n, base) in one call). ``kept[li]`` [B, L]:
        absolute positions (-1: padding), gathered alongside. With ``shared_set`` layer 0's choice serves every layer."""
        keep, L = self.cfg.budget - self.cfg.interval, cache.layers[0].keys.shape[2]
        new_n = torch.where(due, base + keep, n)
        L2, B = int(new_n.max()), n.shape[0]
        ar = torch.arange(L2, device=n.device)
        # rows left as they are: entry j of the new row is entry j + (L - n) - (L2 - n) of the old one
        plain = (ar[None] + (L - L2)).clamp(0, L - 1).expand(B, -1)
        layers = range(1 if self.cfg.shared_set else len(cache.layers))
        src = [plain.clone() for _ in layers]
        for m, b0 in {(int(n[b]), int(base[b])) for b in due.nonzero().flatten().tolist()}:
            g = (due & (n == m) & (base == b0)).nonzero().flatten()
            whole = len(g) == B and m == L and b0 == 0  # the unpadded batch: today's call on the cache itself
            for li in layers:
                k = cache.layers[li].keys if whole else cache.layers[li].keys[g, :, L - m + b0 :]
                q = queries[li] if whole or queries[li] is None else queries[li][g]
                idx = self.method(k, q, keep, self.cfg) + (L - m + b0)  # [G, keep], into the old L
                front = torch.arange(L - m, L - m + b0, device=n.device).expand(len(g), -1)
                src[li][g, L2 - b0 - keep :] = torch.cat([front, idx], dim=1)
        for li, layer in enumerate(cache.layers):
            s = src[0 if self.cfg.shared_set else li]
            gi = s[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, gi), layer.values.gather(2, gi)
            kept[li] = torch.where(ar[None] >= L2 - new_n[:, None], kept[li].gather(1, s), -1)
        return new_n

    def _generate_rows(self, prompts: list[list[int]], s: Sampling, lockstep: bool = False) -> list[tuple]:
        """One batch, left-padded when lengths differ: per row (tokens, log-probs, finish, dense peak, sparse peak, KV
        token-steps held, compressed at least once)."""
        from transformers import DynamicCache

        model = unwrap(self.policy)
        device = next(self.policy.parameters()).device
        p = torch.tensor([len(x) for x in prompts], device=device)
        B, P = len(prompts), int(p.max())
        ids = torch.tensor([[0] * (P - len(x)) + x for x in prompts], device=device)
        pos = (torch.arange(P, device=device)[None] - (P - p)[:, None]).clamp(min=0)  # [B, P], padding at 0
        real = torch.arange(P, device=device)[None] >= (P - p)[:, None]  # [B, P]: not padding
        cache, queries = DynamicCache(), [None] * model.config.num_hidden_layers
        handles = self._query_hooks(model, queries) if KV_POLICIES.spec(self.cfg.method).needs_queries else []
        kept = [torch.where(real, pos, -1) for _ in queries]  # absolute positions per layer, -1 = padding
        n, base = p.clone(), p.clone() if self.cfg.keep_prompt else torch.zeros_like(p)
        toks, lps = [], []
        done = torch.zeros(B, dtype=torch.bool, device=device)
        peak, held, cut = p.cpu().clone(), p.cpu().clone(), torch.zeros(B, dtype=torch.bool)
        stops = torch.tensor(sorted(self.stop_ids), device=device)
        try:
            mask = real.long() if bool((p != P).any()) else None
            out = self.policy(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1]
            for t in range(s.max_tokens):
                live = not bool(done.all())  # under lockstep a finished batch keeps stepping without sampling
                if live:
                    tok, lp = _sample(logits, s)
                    toks.append(tok)
                    lps.append(lp)
                    done |= torch.isin(tok, stops)
                finished = bool(done.all()) or t == s.max_tokens - 1
                if _all_ranks(int(finished), torch.distributed.ReduceOp.MIN, self.policy) if lockstep else finished:
                    break
                if not finished:
                    due = self._due(n, base, p, t)
                    if bool(due.any()):
                        n = self._compress(cache, kept, queries, n, base, due)
                        cut |= (due & ~done).cpu()  # a finished row's cut is a filler's, not its rollout's
                    kept = [torch.cat([k, (p + t)[:, None]], dim=1) for k in kept]
                    n = n + 1
                if self.record:
                    self.kept_log.append([k.clone() for k in kept])
                mask = _decode_mask(cache.layers[0].keys.shape[2], n)
                logits = self.policy(
                    input_ids=tok.unsqueeze(1), attention_mask=mask, position_ids=(p + t)[:, None], past_key_values=cache, use_cache=True
                ).logits[:, -1]
                peak = torch.where(done.cpu(), peak, torch.maximum(peak, n.cpu()))
                held = torch.where(done.cpu(), held, held + n.cpu())  # the entries that produced the next token
        finally:
            for h in handles:
                h.remove()
        return self._rows(torch.stack(toks, 1).tolist(), torch.stack(lps, 1).tolist(), p.tolist(), peak, held, cut)

    def _rows(self, toks: list, lps: list, p: list, peak, held, cut) -> list[tuple]:
        """Per row, cut after its first stop token: (tokens, log-probs, finish, dense peak, sparse peak, token-steps, cut)."""
        out = []
        for b in range(len(toks)):
            end = next((i for i, x in enumerate(toks[b]) if x in self.stop_ids), None)
            keep = len(toks[b]) if end is None else end + 1
            row = (toks[b][:keep], lps[b][:keep], "length" if end is None else "stop", p[b] + keep - 1, int(peak[b]))
            out.append(row + (int(held[b]), bool(cut[b])))
        return out


def dense_token_steps(prompt: int, completion: int) -> int:
    """KV token-steps of one sequence with a full cache: token i (from 0) is produced by a forward holding prompt + i
    entries, so the sum over the ``completion`` tokens is completion * prompt + completion * (completion - 1) / 2."""
    return completion * prompt + completion * (completion - 1) // 2


def _decode_mask(L: int, n: torch.Tensor) -> torch.Tensor | None:
    """The 2-D attention mask [B, L + 1] of one decoding forward (L cached entries, row b's n[b] - 1 of them real and
    right-aligned, then the fed token); None when no row has padding (the unpadded batch's call)."""
    if not bool((n != L + 1).any()):
        return None
    old = torch.arange(L, device=n.device)[None] >= (L - n + 1)[:, None]
    return torch.cat([old, torch.ones_like(old[:, :1])], dim=1).long()


def _zero3(policy) -> bool:
    """True when the module's parameters are ZeRO-3 partitioned (DeepSpeed tags them with ``ds_id``) on several ranks."""
    dist = torch.distributed
    multi = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return multi and any(hasattr(p, "ds_id") for p in policy.parameters())


def _all_ranks(x: int, op, policy) -> int:
    """``x`` reduced with ``op`` over all ranks (on the model's device: gloo on CPU, NCCL on GPU)."""
    t = torch.tensor([x], device=next(policy.parameters()).device)
    torch.distributed.all_reduce(t, op=op)
    return int(t.item())
