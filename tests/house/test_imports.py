"""Importing a module of ``pods/`` defines names and does nothing else: no file appears (under HOME, the working
directory or TMPDIR), no thread or process starts, no environment variable changes, nothing goes to the network
(``support/import_probe.py`` watches each import in a fresh interpreter). And the modules that a config error, the
memory estimate or an entry point's numerics pinning must reach before torch loads import no torch.

A ``__main__`` module is a command (importing it runs it) and is not imported here; a module needing an optional
package this machine lacks (vLLM, DeepSpeed) is skipped, naming the package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.layers import PODS, modules

ROOT = PODS.parent
PROBE = ROOT / "tests" / "support" / "import_probe.py"
IMPORTED = [m for m in modules() if not m.endswith(".__main__")]

# imported without torch: where a bad config is refused (in one line, before any model loads), the memory estimate's
# vocabulary and the engines' models (numbers only), and the entry points, which pin the CPU numerics before torch loads
TORCH_FREE = [
    "pods",
    "pods.errors",
    "pods.registry",
    "pods.log",
    "pods.numerics",
    "pods.schema",
    "pods.architectures",
    "pods.engines",
    "pods.engines.memory",
    "pods.memory",
    "pods.config",
    "pods.compose",
    "pods.preflight",
    "pods.gpu_env",
    "pods.train",
    "pods.demo",
    "pods.eval.cli",
]


def clean_env(tmp, path: list[str]) -> dict:
    """This environment with HOME, TMPDIR and every cache folder inside ``tmp`` (so a file written on import is seen),
    ``path`` and the repository first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("XDG_") or k.endswith(("_HOME", "_CACHE", "_CACHE_DIR")))}
    for name in ("home", "cwd", "tmp"):
        (tmp / name).mkdir()
    env.update(HOME=str(tmp / "home"), TMPDIR=str(tmp / "tmp"), PYTHONPATH=os.pathsep.join([*path, str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def probe(tmp, names: list[str], path: list[str] = ()) -> dict:
    env = clean_env(tmp, list(path))
    out = subprocess.run([sys.executable, str(PROBE), *names], cwd=tmp / "cwd", env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    """{module: what importing it did}, every module of pods/ imported once, in one fresh interpreter."""
    return probe(tmp_path_factory.mktemp("imports"), IMPORTED)


@pytest.mark.parametrize("module", IMPORTED)
def test_importing_defines_and_does_nothing_else(imported, module):
    got = imported[module]
    if "missing" in got:
        pytest.skip(f"{module} needs {got['missing']}, not installed here")
    assert "error" not in got, f"importing {module} failed: {got['error']}"
    assert not got["did"], f"importing {module}: " + "; ".join(got["did"])


def test_the_probe_sees_what_an_import_does(tmp_path):
    """The probe itself, on a package whose import writes a file, starts a thread and a process, sets a variable
    and asks for a host; a module that needs a package nobody has is reported as missing it."""
    pkg = tmp_path / "lib" / "noisy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os, socket, subprocess, threading, time\n"
        "open('made.txt', 'w').close()\n"
        "threading.Thread(target=time.sleep, args=(2,), name='sleeper', daemon=True).start()\n"
        "child = subprocess.Popen(['sleep', '2'])\n"
        "os.environ['NOISY'] = '1'\n"
        "try:\n    socket.getaddrinfo('example.org', 80)\nexcept OSError:\n    pass\n"
    )
    (tmp_path / "lib" / "needy.py").write_text("import no_such_package_anywhere\n")
    got = probe(tmp_path, ["json", "noisy", "needy"], [str(tmp_path / "lib")])
    assert got["json"] == {"did": []}
    did = got["noisy"]["did"]
    assert did[0] == f"created {tmp_path / 'cwd' / 'made.txt'}" and "started thread sleeper" in did
    assert any(d.startswith("started process ") for d in did) and "set NOISY='1' (was None)" in did
    assert "opened the network: getaddrinfo 'example.org'" in did
    assert got["needy"] == {"missing": "no_such_package_anywhere", "did": []}


def test_no_torch_before_it_is_needed():
    """Each module of ``TORCH_FREE`` in turn (one interpreter: the first to load torch is named); ``pods.memory``
    alone loads no engine either (the engines' memory models import the vocabulary, never the estimator)."""
    code = (
        "import importlib, sys\n"
        "for m in sys.argv[1:]:\n"
        "    importlib.import_module(m)\n"
        "    if 'torch' in sys.modules:\n"
        "        sys.exit(f'importing {m} imports torch')\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *TORCH_FREE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    code = "import sys, pods.memory; assert not [m for m in sys.modules if m.startswith(('pods.engines', 'torch'))], sorted(sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
