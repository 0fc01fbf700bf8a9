"""The Makefile's doors stay few and the README short: ``make help`` lists at most 15 targets, README.md is at most 150
lines, and every paper figure, CPU comparison and benchmark runs through one door, ``make reproduce FIG=NAME``:

- ``make reproduce`` with no or an unknown FIG exits non-zero and lists the names;
- every FIG name's command is printed by ``make -n reproduce FIG=NAME``;
- every old target name (an alias, not in ``make help``) runs the same command as its FIG.

Only ``make -n`` runs here: nothing trains or installs.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from support.layers import PODS

ROOT = PODS.parent
STAMP = ".venv/.installed-cpu"  # -o: the install stamp counts as up to date, so -n prints only the command itself


def make(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "FIG")}  # not a parent make's
    out = subprocess.run(["make", "-s", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert not check or out.returncode == 0, f"make {' '.join(args)}: {out.stderr[-2000:]}"
    return out


def make_value(expression: str) -> str:
    """What ``expression`` expands to in the Makefile."""
    return make("--eval", f"print-value: ; @echo '{expression}'", "print-value").stdout.strip()


FIGS = make_value("$(patsubst FIG_%,%,$(filter FIG_%,$(.VARIABLES)))").split()
ALIASES = dict(a.split("=") for a in make_value("$(ALIASES)").split())


def test_make_help_lists_at_most_15_targets():
    targets = [line.split()[0] for line in make("help").stdout.splitlines() if line.strip()]
    assert len(targets) <= 15, f"make help lists {len(targets)} targets: {targets}"
    assert "reproduce" in targets
    hidden = set(targets) & set(ALIASES)
    assert not hidden, f"old names are aliases, not doors: {sorted(hidden)}"


def test_readme_is_at_most_150_lines():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 150, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("fig", ["", "no-such-figure"])
def test_reproduce_without_a_valid_fig_lists_the_names(fig):
    out = make("reproduce", *([f"FIG={fig}"] if fig else []), check=False)
    assert out.returncode != 0
    listed = {line.split()[0].rstrip(",") for line in out.stderr.splitlines() if line.startswith("  ")}
    missing = [f for f in FIGS if not f.endswith("-plot") and f not in listed]
    assert not missing, f"make reproduce does not list: {missing}\n{out.stderr}"


def test_every_fig_has_a_command():
    assert len(FIGS) >= 20, FIGS
    for fig in FIGS:
        assert make("-n", "-o", STAMP, "reproduce", f"FIG={fig}").stdout.strip(), f"FIG={fig} runs nothing"


def test_every_old_name_runs_its_figs_command():
    assert set(ALIASES.values()) <= set(FIGS), sorted(set(ALIASES.values()) - set(FIGS))
    variables = ["SEEDS=1,2", "ARGS=x=1", "LAUNCHER=local", "RUNS=r", "GPU_PY=/g", "REFERENCE=ref"]
    for old, fig in ALIASES.items():
        alias = make("-n", "-o", STAMP, *variables, old).stdout
        door = make("-n", "-o", STAMP, *variables, "reproduce", f"FIG={fig}").stdout
        assert alias == door and re.search(r"\S", door), f"make {old} ran {alias!r}, make reproduce FIG={fig} {door!r}"
