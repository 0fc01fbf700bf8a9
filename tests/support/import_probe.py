"""Import modules one after another and report, for each, what its import did beyond defining names (run in a fresh
interpreter by tests/house/test_imports.py): ``python import_probe.py MODULE ...`` prints one JSON object,
{module: {"missing": the optional package it needs, or "error": the exception, or "did": [side effects]}}.

A side effect is charged to the first module whose import causes it: a file that appears under HOME, the working
directory or TMPDIR (the test points them at empty folders), a new thread, a child process, a changed environment
variable, or a network connection (refused here, so nothing leaves the machine).
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import threading
from pathlib import Path

WATCHED = [Path.home(), Path.cwd(), Path(os.environ.get("TMPDIR", "/tmp"))]
attempts: list[str] = []


def refuse(kind: str):
    def guard(*args, **kwargs):
        attempts.append(f"{kind} {args[1] if kind == 'connect' else args[0]!r}")  # (socket, address) or (host, port, ...)
        raise OSError(f"import_probe: no network during an import ({kind})")

    return guard


socket.socket.connect = socket.socket.connect_ex = refuse("connect")
socket.getaddrinfo = refuse("getaddrinfo")


def files() -> set[str]:
    return {str(p) for root in WATCHED for p in root.rglob("*")}


def children() -> set[int]:
    """Processes whose parent is this one (Linux /proc; empty elsewhere)."""
    me, out = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            out.add(int(stat.parent.name))
    return out


def state() -> dict:
    return {"files": files(), "threads": {t.name for t in threading.enumerate()}, "children": children(), "env": dict(os.environ)}


def did(before: dict, after: dict) -> list[str]:
    out = [f"created {f}" for f in sorted(after["files"] - before["files"])]
    out += [f"started thread {t}" for t in sorted(after["threads"] - before["threads"])]
    out += [f"started process {p}" for p in sorted(after["children"] - before["children"])]
    env_a, env_b = before["env"], after["env"]
    out += [f"set {k}={env_b.get(k)!r} (was {env_a.get(k)!r})" for k in sorted(set(env_a) | set(env_b)) if env_a.get(k) != env_b.get(k)]
    out += [f"opened the network: {a}" for a in attempts]
    attempts.clear()
    return out


def probe(names: list[str]) -> dict:
    report, before = {}, state()
    for name in names:
        try:
            importlib.import_module(name)
            report[name] = {}
        except ModuleNotFoundError as e:  # an optional package (vllm, deepspeed) this machine lacks
            report[name] = {"missing": e.name} if e.name and e.name.split(".")[0] != "pods" else {"error": repr(e)}
        except Exception as e:  # noqa: BLE001 - reported: the test fails with it
            report[name] = {"error": f"{type(e).__name__}: {e}"}
        after = state()
        report[name]["did"] = did(before, after)
        before = after
    return report


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1:])))
