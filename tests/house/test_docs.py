"""The docs' tables that mirror the code, checked both ways so that they cannot drift:

- docs/layout.md's module table has one row per module of ``pods/`` (and no row for a module that is gone), with the
  layer ``tests/house/test_layers.py`` gives it; its layer table lists ``LAYERS`` as the test does;
- docs/layout.md's registry table has one row per ``Registry(...)`` in ``pods/``, naming exactly what pods registers in
  it (read in a fresh interpreter, so names a test registers do not count) and its spec type with the type's fields,
  and each config key it names exists;
- README's config cheat sheet lists every option of each group in ``conf/``, and nothing else;
- every file path, module or link that README.md and docs/*.md name exists.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.layers import LAYERS, PODS, layer_of, modules

ROOT = PODS.parent
README = ROOT / "README.md"
LAYOUT = ROOT / "docs" / "layout.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
TICKED = re.compile(r"`([^`]+)`")


def table(path: Path, first: str) -> list[list[str]]:
    """The body rows (lists of cells) of the markdown table in ``path`` whose header's first cell is ``first``."""
    rows, inside = [], False
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else None
        if cells is None:
            inside = False
        elif cells[0] == first:
            inside = True
        elif inside and not set(cells[0]) <= set("-: "):
            rows.append(cells)
    assert rows, f"{path.name}: no table with a first column '{first}'"
    return rows


def ticked(cell: str) -> list[str]:
    return TICKED.findall(cell)


# ---- modules and layers ------------------------------------------------------------------------------------------


def module_rows() -> dict[str, int]:
    return {ticked(r[0])[0]: int(r[1]) for r in table(LAYOUT, "module")}


def test_every_module_has_a_row_and_every_row_a_module():
    rows, mods = set(module_rows()), set(modules())
    assert not mods - rows, f"docs/layout.md's module table lacks: {sorted(mods - rows)}"
    assert not rows - mods, f"docs/layout.md's module table names modules that do not exist: {sorted(rows - mods)}"


def test_module_rows_give_each_module_its_layer():
    wrong = {m: (doc, layer_of(m)) for m, doc in module_rows().items() if doc != layer_of(m)}
    assert not wrong, f"docs/layout.md layer != tests/house/test_layers.py layer (module: (doc, test)): {wrong}"


def test_layer_table_lists_the_layers_of_the_test():
    doc = {int(r[0]): (r[1], ticked(r[2])) for r in table(LAYOUT, "layer")}
    assert doc == {k: (name, patterns) for k, (name, patterns) in LAYERS.items()}


# ---- registries --------------------------------------------------------------------------------------------------


def registry_sites() -> list[tuple[str, str]]:
    """(module, variable) of every ``NAME = Registry(...)`` at the top level of a module of pods/."""
    out = []
    for mod, path in modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "Registry":
                out += [(mod, t.id) for t in node.targets if isinstance(t, ast.Name)]
    return sorted(out)


COLLECT = """
import dataclasses, importlib, json, pkgutil, sys
import pods
for info in pkgutil.walk_packages(pods.__path__, "pods."):
    if not info.name.endswith(".__main__"):
        importlib.import_module(info.name)
sites = json.loads(sys.argv[1])
regs = {name: getattr(sys.modules[mod], name) for mod, name in sites}
spec = lambda t: [t.__name__, *(f.name for f in dataclasses.fields(t))] if t else []
print(json.dumps({name: [r.names(), spec(r.spec_type)] for name, r in regs.items()}))
"""


@pytest.fixture(scope="module")
def registries() -> dict[str, tuple[str, list[str], list[str]]]:
    """{variable: (module, names, [spec type, its fields...] or [])} as pods registers them, every module of pods/
    imported in a fresh interpreter."""
    sites = registry_sites()
    assert len({name for _, name in sites}) == len(sites), f"two registries share a variable name: {sites}"
    out = subprocess.run([sys.executable, "-c", COLLECT, json.dumps(sites)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    names = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: (mod, *names[name]) for mod, name in sites}


def registry_rows() -> dict[str, tuple[str, list[str], list[str], list[str]]]:
    return {ticked(r[0])[0]: (ticked(r[1])[0], ticked(r[2]), ticked(r[3]), ticked(r[4])) for r in table(LAYOUT, "registry")}


def test_registry_table_matches_the_code(registries):
    rows = registry_rows()
    assert set(rows) == set(registries), (
        f"registries in code but not docs/layout.md: {sorted(set(registries) - set(rows))}; in docs only: {sorted(set(rows) - set(registries))}"
    )
    for name, (mod, names, spec) in registries.items():
        assert rows[name][0] == mod, f"{name} lives in {mod}, docs/layout.md says {rows[name][0]}"
        assert rows[name][2] == names, f"{name}: docs/layout.md lists {rows[name][2]}, the code registers {names}"
        assert rows[name][3] == spec, f"{name}: docs/layout.md gives the spec {rows[name][3]}, the code {spec or 'none'}"


def _fields(section: str) -> set[str] | None:
    """The keys of a config section (every shape of a union), or None for a section that is not a config's."""
    from typing import get_args

    from pods.eval.benchmarks import Benchmark, Suite
    from pods.schema import Root

    if section in Root.model_fields:
        annotation = Root.model_fields[section].annotation
        return {k for model in (get_args(annotation) or (annotation,)) for k in model.model_fields}
    return {"benchmark": set(Benchmark.model_fields), "suite": set(Suite.model_fields)}.get(section)


def test_registry_table_names_config_keys_that_exist():
    missing = []
    for name, (_, chosen, _, _) in registry_rows().items():
        for key in (k for k in chosen if re.fullmatch(r"[a-z_]+\.[a-z_]+", k)):
            section, _, field = key.partition(".")
            fields = _fields(section)
            if fields is not None and field not in fields:
                missing.append(f"{name}: {key}")
    assert not missing, f"docs/layout.md names config keys the schema does not have: {missing}"


# ---- README's cheat sheet ----------------------------------------------------------------------------------------


def test_cheat_sheet_lists_every_option_of_each_group():
    for row in table(README, "group"):
        group, options = ticked(row[0])[0], ticked(row[1])
        if not (ROOT / "conf" / group).is_dir() or group == "experiment":
            continue
        on_disk = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml") if not p.stem.startswith("_"))
        assert sorted(options) == on_disk, f"README's `{group}` options {sorted(options)} != conf/{group}/: {on_disk}"


def test_cheat_sheet_keys_exist():
    """Each key the cheat sheet names (``algorithm.n``, or ``m`` after it in the same row) is a key of that section."""
    rows = [(ticked(r[0])[0], r[2]) for r in table(README, "group")] + [(ticked(r[0])[0], r[1]) for r in table(README, "section")]
    missing = []
    for section, cell in rows:
        fields = _fields(section)
        for key in (k for k in ticked(cell) if fields is not None and re.fullmatch(r"[a-z_.]+", k)):
            head = key.removeprefix(f"{section}.").split(".")[0]
            if head not in fields:
                missing.append(f"{section}: {key}")
    assert not missing, f"README's cheat sheet names keys the schema does not have: {missing}"


def test_readme_lists_every_script():
    text = README.read_text()
    missing = [p.name for p in sorted((ROOT / "scripts").glob("*.py")) if f"`scripts/{p.name}" not in text]
    assert not missing, f"README's scripts/ section lacks: {missing}"


# ---- what the docs name exists -----------------------------------------------------------------------------------

PATH = re.compile(r"(?:pods|tests|benchmarks|scripts|slurm|docs|conf)/[\w./*\-]*")
MODULE = re.compile(r"pods(?:\.\w+)+")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names |= {t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _module_exists(dotted: str, mods: dict[str, Path]) -> bool:
    """``pods.a.b`` is a module, or its longest module prefix defines the next name at its top level
    (``pods.downsample.select``); deeper attributes (``pods.schema.Root.model_dump``) are not checked."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in mods:
            return i == len(parts) or parts[i] in _top_level_names(mods[prefix])
    return False


def named_things(doc: Path) -> list[str]:
    """The paths (in backticks) and the link targets of ``doc`` that do not exist, and the modules it names that do not."""
    text, mods, bad = doc.read_text(), modules(), []
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # code blocks: commands, not names
    for tick in (t for line in prose.splitlines() for t in TICKED.findall(line)):
        for token in tick.split():
            path = PATH.fullmatch(token.split("::")[0].rstrip(".,:;"))
            if path and not any(ROOT.glob(path.group(0).rstrip("/"))):
                bad.append(token)
            if MODULE.fullmatch(token.rstrip(".,:;()")) and not _module_exists(token.rstrip(".,:;()"), mods):
                bad.append(token)
    bad += [f"-m {m}" for m in re.findall(r"-m (pods(?:\.\w+)+)", text) if m not in mods]  # commands, code blocks too
    for target in LINK.findall(text):
        if "://" not in target and not (doc.parent / target).exists():
            bad.append(f"({target})")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_what_the_docs_name_exists(doc):
    bad = named_things(doc)
    assert not bad, f"{doc.relative_to(ROOT)} names what does not exist: {bad}"
    issues = re.findall(r"\bissues? #?\d+", doc.read_text(), flags=re.I)
    assert not issues, f"{doc.relative_to(ROOT)} points at tracker issues a reader cannot follow: {issues}"
