"""The layers of ``pods/`` (docs/layout.md, "Layers"): no import circle, and no import from a lower layer to a higher
one except the one in ``ALLOWED_UP``.

Imports are read with ``ast`` from every module, wherever they sit in the file (inside functions, under
``TYPE_CHECKING``): a lazy import is still a dependency. An import of ``pods.a.b`` counts as an edge to the deepest
module of ``pods/`` it names. Every module must have a layer: a new top-level module, or a new module of a package
that is mapped module by module (``pods.memory``, ``pods.schema`` ...), fails ``test_every_module_has_a_layer`` until
it is placed below; a new module of a plug-in package mapped with ``.*`` (a task, an engine, a backend, a result
reader) takes its package's layer.
"""

from __future__ import annotations

import ast
import functools
import graphlib
from pathlib import Path

PODS = Path(__file__).resolve().parents[1] / "pods"

# bottom to top; "pkg.*" = the package and every module below it; an exact name wins over a pattern
LAYERS: dict[int, tuple[str, list[str]]] = {
    0: ("ground", ["pods", "pods.errors", "pods.registry", "pods.log", "pods.progress", "pods.signals", "pods.numerics"]),
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
            "pods.schedules",
            "pods.step",
            "pods.data",
            "pods.tasks.*",
            "pods.models",
            "pods.tiny",
            "pods.architectures",  # describes models, the tiny one included (pods.tiny.DEFAULT_SPEC)
            "pods.grade",
        ],
    ),
    3: (
        "machinery",
        [
            "pods.engines.*",
            "pods.backends.*",
            "pods.distributed",
            "pods.checkpoint",
            "pods.metrics",
            "pods.wandb_log",
            "pods.evaluate",
            "pods.memory",  # the estimate: asks each engine for its lines (pods.engines.memory)
            "pods.memory.lines",  # the vocabulary of a memory estimate, which each engine's memory model speaks
            "pods.memory.update",  # the policy update's memory
        ],
    ),
    4: ("rules", ["pods.config", "pods.preflight", "pods.gpu_env"]),
    5: ("composition + run", ["pods.compose", "pods.loop", "pods.launch", "pods.evals.*"]),
    6: (
        "entry points",
        [
            "pods.train",
            "pods.eval",
            "pods.evals.cli",
            "pods.memory.report",
            "pods.memory.__main__",
            "pods.figures",
            "pods.demo",
            "pods.results.*",
            "pods.d3s_report",
        ],
    ),
}

# (importer, imported): the only imports allowed to run from a lower layer up to a higher one, with the reason
ALLOWED_UP: dict[tuple[str, str], str] = {}


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


def test_every_module_has_a_layer():
    missing = sorted(m for m in modules() if layer_of(m) is None)
    assert not missing, f"place these modules in a layer of tests/test_layers.py LAYERS (and docs/layout.md): {missing}"


def test_every_layer_entry_names_a_module():
    mods = modules()
    stale = [p for _, patterns in LAYERS.values() for p in patterns if (p[:-2] if p.endswith(".*") else p) not in mods]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_no_import_circle():
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import circle in pods/: {' -> '.join(e.args[1])}") from None


def upward_imports() -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits in a higher layer than the importer."""
    graph = import_graph()
    return sorted((a, b) for a, deps in graph.items() for b in deps if (layer_of(b) or 0) > (layer_of(a) or 0))


def test_no_import_runs_up_a_layer():
    up = upward_imports()
    bad = [f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})" for a, b in up if (a, b) not in ALLOWED_UP]
    assert not bad, "imports from a lower layer to a higher one:\n  " + "\n  ".join(bad)


def test_no_import_runs_a_higher_package_first():
    """Importing ``pkg.sub`` runs ``pkg/__init__.py`` first: a module outside ``pkg`` may import ``pkg.sub`` only when
    the package itself sits in the importer's layer or below, else the higher layer loads behind the import."""
    mods, bad = modules(), []
    for a, deps in import_graph().items():
        for b in deps:
            parents = [p for p in (b.rsplit(".", i)[0] for i in range(1, b.count("."))) if p in mods and not a.startswith(p + ".")]
            bad += [f"{a} (layer {layer_of(a)}) -> {b} runs {p} (layer {layer_of(p)})" for p in parents if layer_of(p) > layer_of(a)]
    assert not bad, "imports that load a higher layer through a package's __init__:\n  " + "\n  ".join(sorted(bad))


def test_the_allowed_exception_is_one_and_still_needed():
    assert len(ALLOWED_UP) <= 1, "at most one import may run up a layer"
    unused = set(ALLOWED_UP) - set(upward_imports())
    assert not unused, f"ALLOWED_UP lists imports that no longer run up a layer (remove them): {sorted(unused)}"


def test_the_graph_reader_resolves_relative_and_lazy_imports(tmp_path):
    """The reader itself: a relative import, an import inside a function (``from pods import low`` runs pods/__init__.py
    too) and a package importing its own parts (no edge)."""
    pkg = tmp_path / "pods"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("X = 1\n")
    (pkg / "sub" / "__init__.py").write_text("from pods.sub import part\n")
    (pkg / "sub" / "part.py").write_text("from ..low import X\n\ndef f():\n    from pods import low\n")
    assert import_graph(pkg) == {"pods": set(), "pods.low": set(), "pods.sub": set(), "pods.sub.part": {"pods", "pods.low"}}
