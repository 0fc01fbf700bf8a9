"""Every third-party package that ``pods/`` imports by name is declared in pyproject.toml: in ``dependencies``, or in
an optional extra for the code paths that need one (vLLM, DeepSpeed, bitsandbytes). torch alone is left out on
purpose: the Makefile installs it first (CPU or CUDA build), so pip never resolves it (pyproject.toml says why)."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys

import pytest

from support.layers import PODS

ROOT = PODS.parent
INSTALLED_FIRST = {"torch"}  # installed by the Makefile before pods, never declared (see pyproject.toml)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_names() -> dict[str, str]:
    """{top-level module name: first file importing it} over every absolute import in ``pods/`` (lazy ones inside
    functions included)."""
    found: dict[str, str] = {}
    for path in sorted(PODS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def declared() -> set[str]:
    """The distributions pyproject.toml names: the dependencies and every optional extra."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (pods supports 3.10, where this check is skipped)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project.get("optional-dependencies", {}).values() for r in extra]
    return {normalise(re.match(r"[A-Za-z0-9_.\-]+", r).group(0)) for r in reqs}


@functools.cache
def providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions(module: str) -> list[str]:
    """The installed distributions providing ``module``; its own name when none is installed here (a GPU-only one)."""
    return [normalise(d) for d in providers().get(module, [])] or [normalise(module)]


def test_every_directly_imported_package_is_declared():
    third_party = {m: f for m, f in imported_top_names().items() if m not in sys.stdlib_module_names and m != "pods"}
    assert {"transformers", "requests", "huggingface_hub"} <= set(third_party)  # the scan sees lazy imports too
    have = declared()
    missing = [
        f"{m} (imported in {f}; distribution {' or '.join(distributions(m))})"
        for m, f in sorted(third_party.items())
        if m not in INSTALLED_FIRST and not set(distributions(m)) & have
    ]
    assert not missing, "imported but not declared in pyproject.toml: " + ", ".join(missing)
