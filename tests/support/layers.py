"""The layers of ``pods/`` (docs/layout.md, "Layers") and the package's import graph, read from the source with
``ast``; tests/house/test_layers.py and tests/house/test_docs.py check them."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PODS = Path(__file__).resolve().parents[2] / "pods"

# bottom to top; "pkg.*" = the package and every module below it; an exact name wins over a pattern
LAYERS: dict[int, tuple[str, list[str]]] = {
    0: ("ground", ["pods", "pods.errors", "pods.registry", "pods.log", "pods.progress", "pods.signals", "pods.numerics", "pods.files"]),
    1: ("schema", ["pods.schema.*"]),
    2: (
        "algorithm + data",
        [
            "pods.advantages",
            "pods.downsample",
            "pods.losses",
            "pods.tokens",
            "pods.d3s",
            "pods.sparse_rl",
            "pods.behaviour_is",  # truncated importance weights against the sampler (stale rollouts)
            "pods.schedules",
            "pods.plan",  # the plan of a step (kept per group, micro-batches): the loop, the backends and the memory estimate read it
            "pods.data",
            "pods.tasks.*",
            "pods.models",
            "pods.tiny",
            "pods.architectures",  # describes models, the tiny one included (pods.tiny.DEFAULT_SPEC)
            "pods.grade",
        ],
    ),
    3: ("engines", ["pods.engines.*"]),  # with the vocabulary of a memory estimate (pods.engines.memory) their models speak
    4: (
        "machinery",
        [
            "pods.backends.*",  # above the engines: the sampler gap asks the engine what its log-probs are (gap_meaning)
            "pods.distributed",
            "pods.checkpoint",
            "pods.metrics",
            "pods.wandb_log",
            "pods.wandb_records",  # reading the offline W&B files back (what `wandb sync` sends)
            "pods.eval.accuracy",  # test accuracy during training (the loop's evaluation)
            "pods.memory",  # the package: its __init__ defines nothing
            "pods.memory.estimator",  # the estimate: asks each engine for its lines (Engine.memory)
            "pods.memory.update",  # the policy update's memory
            "pods.integrations.*",  # pods' selection inside another trainer (TRL's GRPOTrainer)
        ],
    ),
    5: ("rules", ["pods.config", "pods.preflight", "pods.gpu_env", "pods.resume"]),
    6: ("composition + run", ["pods.compose", "pods.loop.*", "pods.launch", "pods.eval.*"]),
    7: (
        "entry points",
        [
            "pods.train",
            "pods.usage",
            "pods.eval.__main__",
            "pods.eval.cli",
            "pods.export",  # pods-export: a run as a plain model directory
            "pods.memory.report",
            "pods.memory.__main__",
            "pods.figures",
            "pods.demo",
            "pods.results.*",
        ],
    ),
}


def modules(root: Path = PODS) -> dict[str, Path]:
    """{dotted name: file} of every module of the package at ``root`` (a package is named by its ``__init__.py``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imported(name: str, path: Path, node: ast.AST) -> list[str]:
    """The dotted names an import statement ``node`` of module ``name`` (file ``path``) refers to."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the module's package (a package's __init__ is its own package)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


@functools.cache
def import_graph(root: Path = PODS) -> dict[str, set[str]]:
    """{module: the modules of the package it imports}, from the source (not by importing anything)."""
    mods = modules(root)
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(m, path, node):
                while target and target not in mods:  # pods.a.b.attr -> pods.a.b
                    target = target.rpartition(".")[0]
                if target and target != m and not target.startswith(m + "."):  # a package importing its own parts
                    graph[m].add(target)
    return graph


def layer_of(module: str) -> int | None:
    """The layer ``LAYERS`` gives ``module``: its exact name, else the longest ``pkg.*`` pattern covering it."""
    best, best_len = None, -1
    for layer, (_, patterns) in LAYERS.items():
        for p in patterns:
            if p == module:
                return layer
            if p.endswith(".*") and (module == p[:-2] or module.startswith(p[:-1])) and len(p) > best_len:
                best, best_len = layer, len(p)
    return best


def package(module: str) -> str:
    """The package of ``pods`` that holds ``module`` (``pods.memory.update`` -> ``pods.memory``); a top-level module
    (``pods.loop``) is its own."""
    return ".".join(module.split(".")[:2])


def package_graph(root: Path = PODS) -> dict[str, set[str]]:
    """``import_graph`` with each package of ``pods`` as one node: a circle here is two folders that import each
    other through different modules, which the module graph does not show."""
    out: dict[str, set[str]] = {}
    for a, deps in import_graph(root).items():
        out.setdefault(package(a), set()).update(package(b) for b in deps if package(b) != package(a))
    return out
