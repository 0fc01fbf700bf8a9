"""The layers of ``pods/`` (docs/layout.md, "Layers"): no import circle, between modules or between packages (two
folders importing each other through different modules), and no import from a lower layer to a higher one.

Imports are read with ``ast`` from every module, wherever they sit in the file (inside functions, under
``TYPE_CHECKING``): a lazy import is still a dependency. An import of ``pods.a.b`` counts as an edge to the deepest
module of ``pods/`` it names. Every module must have a layer: a new top-level module, or a new module of a package
that is mapped module by module (``pods.memory``, ``pods.schema`` ...), fails ``test_every_module_has_a_layer`` until
it is placed below; a new module of a plug-in package mapped with ``.*`` (a task, an engine, a backend, a result
reader) takes its package's layer.
"""

from __future__ import annotations

import graphlib

from support.layers import LAYERS, import_graph, layer_of, modules, package_graph


def test_every_module_has_a_layer():
    missing = sorted(m for m in modules() if layer_of(m) is None)
    assert not missing, f"place these modules in a layer of tests/support/layers.py LAYERS (and docs/layout.md): {missing}"


def test_every_layer_entry_names_a_module():
    mods = modules()
    stale = [p for _, patterns in LAYERS.values() for p in patterns if (p[:-2] if p.endswith(".*") else p) not in mods]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_no_import_circle():
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import circle in pods/: {' -> '.join(e.args[1][::-1])}") from None


def test_no_circle_between_packages():
    """``pods.memory.estimator`` asks the engines, so no engine may import anything of ``pods/memory/`` (their memory
    models speak ``pods.engines.memory``'s vocabulary): each package sits wholly above or below another."""
    try:
        graphlib.TopologicalSorter(package_graph()).prepare()
    except graphlib.CycleError as e:
        graph, loop = import_graph(), e.args[1][::-1]  # the sorter lists each package before the one importing it
        edges = [
            f"{a} -> {b}"
            for p, q in zip(loop, loop[1:])
            for a, deps in graph.items()
            for b in deps
            if (a + ".").startswith(p + ".") and (b + ".").startswith(q + ".")
        ]
        raise AssertionError(f"packages of pods/ import each other: {' -> '.join(loop)} ({'; '.join(sorted(edges))})") from None


def upward_imports() -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits in a higher layer than the importer."""
    graph = import_graph()
    return sorted((a, b) for a, deps in graph.items() for b in deps if (layer_of(b) or 0) > (layer_of(a) or 0))


def test_no_import_runs_up_a_layer():
    up = upward_imports()
    bad = [f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})" for a, b in up]
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
    assert package_graph(pkg) == {"pods": set(), "pods.low": set(), "pods.sub": {"pods", "pods.low"}}
