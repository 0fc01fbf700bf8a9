"""The ``vllm_server`` engine: rollouts from K stock vLLM servers (``rollout.servers``: a count launched on this host,
or URLs attached), weights pushed through vLLM 0.32's weight-transfer API.

Generation: each request goes to ``/inference/v1/generate`` (token ids in, token ids out) with the colocated engine's
sampling parameters and seeds (``VLLMEngine.request_params``: request i of a call gets ``(seed << 20) + i * n``; an
unseeded call draws its ``seed`` from NumPy's global RNG, which the loop seeds), spread round robin over the servers.
The servers run with ``--logprobs-mode processed_logprobs`` (log softmax after temperature, the loss's quantity) and
return, per completion, the weight-version spans of its tokens: ``Rollouts.versions`` is the oldest of them.

Weight push (``load_weights``, from the trainer thread while another thread may be in ``generate``): pause every server
(``mode=wait``: requests in flight finish on the old weights, then the KV and prefix caches are dropped), send the tensors
through vLLM's trainer-side weight-transfer engine (gloo, ``pods.engines.gloo_transfer``, on CPU; vLLM's NCCL engine on
GPU), finish with the new version as the servers' label, run the sync check (``rollout.sync_check``: the float64
tallies of the first and last decoder layers, ``pods.engines.vllm_sync``, read back over ``/collective_rpc``), and resume
(after a failed push too). Requests sent while paused wait and run on the new weights; their spans say so.

Every HTTP call, and every transfer as a whole (the group's join, each push: NCCL's calls take no timeout), is bounded
by ``rollout.server_timeout_s``: a dead or stuck server is one ``ServerError`` naming its URL or the transfer
(``pods.engines.server_procs``, ``pods.engines.rendezvous``); an aborted transfer leaves the group. No pushed tensor
outlives its push. Launched servers are stopped at ``close``, on a failed start, at interpreter exit, and by the
kernel if the trainer is killed. Refused before anything loads: a vLLM older than 0.32 (here or attached) and, on
GPUs, launched servers without GPUs of their own (``rollout.devices``).
"""

from __future__ import annotations

import atexit
import json
import threading
import time
from functools import partial

import numpy as np
import torch

from pods.engines import rendezvous, server_rules, vllm_start
from pods.engines.base import Engine, Rollouts, Sampling
from pods.engines.server_procs import Servers, launch
from pods.engines.vllm import VLLMEngine, _sampled_logprobs, _with_lm_head  # noqa: F401 - the same rules and weights
from pods.engines.vllm_start import stop_token_ids
from pods.engines.vllm_sync import checked_layers, held, mismatch, tallied
from pods.errors import ServerError
from pods.schema import Root, VllmServerRollout

__all__ = ["VLLMServerEngine"]


class VLLMServerEngine(Engine):
    """``rollout=vllm_server``: K vLLM servers, pushed after every optimizer step (``load_weights``)."""

    section = VllmServerRollout
    needs_sync = True

    def __init__(self, model_dir, tokenizer, cfg: VllmServerRollout, policy=None):  # policy unused: the servers hold copies
        from transformers import AutoConfig

        self.tok, self.cfg, self._version, self.sender, self.source = tokenizer, cfg, 0, None, None
        self.stop_ids = stop_token_ids(str(model_dir), tokenizer)
        self.dtype = getattr(torch, cfg.dtype)
        on_cpu = not torch.cuda.is_available()
        self.transport = cfg.transport if cfg.transport != "auto" else ("gloo" if on_cpu else "nccl")
        self.leader = vllm_start.launch()[0] == 0  # under torchrun rank 0 launches and pushes; the others attach and wait
        if not isinstance(cfg.servers, int):
            procs, urls, logs = [], cfg.servers, None
        elif self.leader:
            procs, urls, logs = launch(str(model_dir), cfg, cfg.servers, on_cpu, self.transport)
        else:
            procs, urls, logs = [], [f"http://127.0.0.1:{cfg.port + k}" for k in range(cfg.servers)], None
        self.servers = Servers(urls, cfg.server_timeout_s, procs, logs)
        self.lock = threading.Lock()  # one push at a time; generate never takes it
        atexit.register(self.close)
        try:
            self.servers.wait_healthy(cfg.start_timeout_s if procs or isinstance(cfg.servers, int) else cfg.server_timeout_s)
            for k in range(len(urls)):
                server_rules.refuse_settings(self.servers, k, cfg)
            if self.leader:
                self._label("0")
                self.sender = self._connect()
        except BaseException:
            self.close()
            raise
        layers = AutoConfig.from_pretrained(str(model_dir)).get_text_config().num_hidden_layers
        self.checked = checked_layers(layers) if cfg.sync_check else []
        self.last_sync_s = 0.0

    @property
    def version(self) -> int:
        """The policy version the servers serve: their label, which each rollout's spans report."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        """Set by the producer (the trainer's count: 0 for the initial weights, the resumed step): rank 0 relabels
        every server, so the rollouts generated next carry it (the start push alone would label them 1)."""
        if value != self._version and self.leader:
            self._label(str(value))
        self._version = value

    def _label(self, version: str) -> None:
        """Every server's weight-version label (what the spans of the rollouts generated next report)."""
        self.servers.each("POST", "/update_weight_version", "setting the weight version", json={"new_version": version})

    # -- the plug-in's rules ------------------------------------------------------------------------
    @classmethod
    def check(cls, cfg: Root) -> None:
        """The colocated engine's rules (budget, truncated log-probs), then the servers' (``pods.engines.server_rules``):
        one training process per launch, a transport this device has, GPUs of their own, a vLLM with the routes this
        engine calls, and attached servers' model length and dtype (asked over HTTP, before anything loads)."""
        VLLMEngine.check(cfg)
        server_rules.check(cfg)

    @classmethod
    def gap_meaning(cls, cfg: Root) -> tuple[str, str]:
        return VLLMEngine.gap_meaning(cfg)

    # -- generation ---------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling, progress: bool = False) -> Rollouts:
        """n completions of every prompt; safe to call from another thread than ``load_weights``'s."""
        copies = n if sampling.temperature <= 0 else 1  # vLLM refuses n > 1 when greedy: repeat the prompt instead
        per = n // copies
        base = sampling.seed if sampling.seed is not None else int(np.random.randint(0, 2**31 - 1))
        requests = [p for p in prompts for _ in range(copies)]
        version = self.version
        futures = [
            self.servers.pool.submit(self._request, i % len(self.servers.urls), p, per, sampling, (base << 20) + i * per)
            for i, p in enumerate(requests)
        ]
        ids, lps, reasons, versions = [], [], [], []
        for f in futures:
            for c in sorted(f.result(), key=lambda c: c["index"]):
                ids.append(list(c["token_ids"]))
                lps.append([t["logprob"] for t in c["logprobs"]["content"]])
                reasons.append(c["finish_reason"])
                spans = c.get("weight_versions") or []
                versions.append(min((int(s["version"]) for s in spans), default=version))
        texts = self.tok.batch_decode(ids, skip_special_tokens=True)
        return Rollouts(prompt_ids=prompts, completion_ids=ids, texts=texts, logprobs=lps, finish_reasons=reasons, n=n, versions=versions)

    def _request(self, k: int, prompt: list[int], n: int, s: Sampling, seed: int) -> list[dict]:
        greedy = s.temperature <= 0
        params = dict(
            n=n,
            temperature=0.0 if greedy else s.temperature,
            top_p=1.0 if greedy else s.top_p,
            top_k=-1 if greedy else s.top_k,
            max_tokens=s.max_tokens,
            seed=seed,
            stop=list(s.stop) or None,
            stop_token_ids=self.stop_ids,
            logprobs=0,
            detokenize=bool(s.stop),
            skip_special_tokens=True,
        )
        body = {"token_ids": list(prompt), "sampling_params": params, "output_mode": "tokens"}
        choices = self.servers.call(k, "POST", "/inference/v1/generate", f"a generate request ({len(prompt)} prompt tokens)", json=body)[
            "choices"
        ]
        for c in choices:
            if c["finish_reason"] not in ("stop", "length"):
                raise ServerError(f"vLLM server {self.servers.urls[k]} ended a request with finish_reason={c['finish_reason']!r}")
        return choices

    # -- weight push --------------------------------------------------------------------------------
    def _connect(self):
        """vLLM's trainer-side transfer engine, joined with every server's worker (ranks 1..K; the trainer is 0), at an
        address the servers reach (``pods.engines.rendezvous``), within ``rollout.server_timeout_s``."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from pods.engines import gloo_transfer

        gloo_transfer.register()
        host = rendezvous.address(self.servers.urls)
        where = dict(master_address=host, master_port=rendezvous.free_port(host), world_size=1 + len(self.servers.urls))
        if self.transport == "gloo":
            info = gloo_transfer.GlooTrainerInitInfo(**where, timeout_s=self.cfg.server_timeout_s, rank=0)
            join = partial(WeightTransferTrainerFactory.trainer_init, info, client=self.servers)
        else:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            self.source = gloo_transfer.Pushed()
            join = partial(
                WeightTransferTrainerFactory.trainer_init, NCCLTrainerInitInfo(**where, rank=0), client=self.servers, source=self.source
            )
        return rendezvous.within(self.cfg.server_timeout_s, f"joining the {self.transport} weight-transfer group at {host}", join)

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Push the full policy (HF names) to every server: pause, send, finish with the version, check, resume."""
        if not self.leader:  # rank 0 pushes; this rank takes part in the export (a collective) and waits for the label
            for _ in named_tensors:
                pass
            return self._await(self.version + 1)
        with self.lock:
            clock = time.perf_counter()
            pushed: dict = {}
            weights = _with_lm_head(named_tensors, self.dtype)
            pairs = list(tallied(weights, self.checked, pushed) if self.checked else weights)
            del weights
            label = str(self.version + 1)
            self.servers.each("POST", "/pause", "pausing for a weight push", params={"mode": "wait", "clear_cache": "true"})
            try:
                self._send(pairs, label)
                del pairs  # the pushed copies (bf16 casts, ZeRO-3 gathers): none outlives the push
                if self.checked:
                    self._verify(pushed)
                self._version += 1
            except BaseException:
                self._resume(quiet=True)  # the push's own error says more than a dead server's refusal to resume
                raise
            self._resume()
            self.last_sync_s = time.perf_counter() - clock

    def _send(self, pairs: list, label: str) -> None:
        """One transfer, bounded by ``rollout.server_timeout_s`` as a whole (``pods.engines.rendezvous.within``): past
        it the group is aborted and left (a later push would need a new one: the run ends on the error)."""
        if self.transport == "gloo":
            send = partial(self.sender.send_weights, pairs, version=label)
        else:
            self.source.pairs, send = pairs, self.sender.send_weights
        try:
            doing = f"vLLM server {', '.join(self.servers.urls)}: the {self.transport} weight push of version {label}"  # who, then what
            rendezvous.within(self.cfg.server_timeout_s, doing, send, abort=self._abort)
        finally:
            if self.source is not None:
                self.source.pairs = []
        if self.transport != "gloo":
            self._label(label)

    def _abort(self) -> None:
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.shutdown()  # NCCL: ncclCommAbort, which ends the trainer's kernels waiting for a dead peer

    def _resume(self, quiet: bool = False) -> None:
        try:
            self.servers.each("POST", "/resume", "resuming after a weight push")
        except ServerError:
            if not quiet:
                raise

    def _await(self, version: int) -> None:
        """Until every server serves ``version`` (rank 0's push), at most ``rollout.server_timeout_s``."""
        deadline = time.monotonic() + self.cfg.server_timeout_s
        for k, url in enumerate(self.servers.urls):
            while self.servers.call(k, "GET", "/weight_info", "GET /weight_info")["weight_version"] != str(version):
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"vLLM server {url} did not reach weight version {version} (rank 0's push) within {self.cfg.server_timeout_s:g} s"
                    )
                time.sleep(0.05)
        self._version = version

    def _verify(self, pushed: dict) -> None:
        """Every server's tally of the checked layers equals the pushed one (``pods.engines.vllm_sync``)."""
        body = {"method": "pods_checksums_json", "args": [json.dumps(self.checked)]}
        for k, answer in enumerate(self.servers.each("POST", "/collective_rpc", "the post-push checksums", json=body)):
            for rows in answer["results"]:
                wrong = mismatch(pushed, held(rows))
                if wrong:
                    raise ServerError(
                        f"weight sync check failed on {self.servers.urls[k]}, {wrong}: the server did not take the push (rollout.sync_check)"
                    )

    def close(self) -> None:
        """Leave the transfer group and stop the servers this engine launched (attached ones keep running)."""
        sender, self.sender = getattr(self, "sender", None), None
        if sender is not None:
            sender.shutdown()
        if getattr(self, "servers", None) is not None:
            self.servers.close()
