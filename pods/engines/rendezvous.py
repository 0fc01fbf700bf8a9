"""Where the trainer meets the ``vllm_server`` engine's servers for a weight transfer, and how long it may take.

The address: the trainer hosts the transfer group's store (rank 0), so every server must reach it. On one host that is
127.0.0.1. Across hosts it is the address of this host's interface that routes to the servers (the kernel's choice of
source address for them), not ``socket.getfqdn()``: on many clusters the host name maps to 127.0.0.1 / 127.0.1.1
(Debian's /etc/hosts) or to a management network the GPU nodes do not route, and a server given that address waits
for the group until its timeout. The port is probed on that address, where the store listens.

The deadline: NCCL's calls take no timeout (``ncclCommInitRank`` and a broadcast whose peer died wait for ever on the
GPU), so each transfer runs in a thread of its own and the trainer waits for it at most ``rollout.server_timeout_s``;
past that the transfer is aborted (vLLM's ``shutdown`` aborts the communicator) and the push is one ``ServerError``.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlparse

import torch

from pods.errors import ServerError

LOCAL = ("127.0.0.1", "localhost", "::1")


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address in LOCAL


def _resolved(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def _route_source(host: str) -> str | None:
    """The address this host sends from to reach ``host`` (a UDP connect sends nothing; it only picks the route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def address(urls: list[str]) -> str:
    """The address the servers reach the trainer at (module docstring); one ``ServerError`` when there is none."""
    hosts = [urlparse(u).hostname or "" for u in urls]
    targets = hosts if all(h in LOCAL for h in hosts) else [_resolved(h) or h for h in hosts]
    if all(_loopback(t) for t in targets):
        return "127.0.0.1"
    name = socket.getfqdn()
    named = _resolved(name)
    routed = _route_source(next(t for t in targets if not _loopback(t)))
    if routed is not None and not _loopback(routed):
        return routed
    if named is not None and not _loopback(named):
        return named
    raise ServerError(
        f"no address of this host reaches the servers ({', '.join(sorted(set(hosts)))}): its name {name!r} maps to "
        f"{named or 'nothing'} and no route to them leaves by another interface"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` (where the transfer group's store will listen)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def within(seconds: float, doing: str, fn: Callable, abort: Callable | None = None):
    """``fn()`` in a thread of its own (on the caller's CUDA device), waited for at most ``seconds``; past that
    ``abort()`` and one ``ServerError``, as for any error of ``fn`` (a collective whose peer died). The thread is a
    daemon: one stuck in a collective never holds up the exit."""
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    out: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)  # a new thread starts on cuda:0
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread, raised there
            out["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="pods-weight-transfer", daemon=True).start()
    if not done.wait(seconds):
        if abort is not None:
            abort()
        raise ServerError(
            f"{doing} did not finish within {seconds:g} s (rollout.server_timeout_s): a server died, hung or ran out of "
            "memory mid-transfer; the transfer group was aborted"
        )
    error = out.pop("error", None)
    if isinstance(error, Exception) and not isinstance(error, ServerError):  # a peer gone mid-collective: gloo's reset
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise ServerError(f"{doing} failed: {lines[0][:300]}") from error
    if error is not None:
        raise error
    return out.get("value")
