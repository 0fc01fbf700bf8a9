"""docs/status.md, the one page of every paper claim and figure, cannot rot:

- every name ``make reproduce`` runs (the Makefile's FIG table, the ``-plot`` names aside) has a row there;
- every command in its tables exists: ``make reproduce FIG=NAME`` names a FIG, ``make TARGET`` a target of the
  Makefile, ``python -m MODULE`` a runnable module of pods/, ``python PATH`` and a bare script a file,
  ``experiment=`` and ``+sweep=`` a config file; every ``results/...`` path it names exists;
- every row fills its five columns, and a row without a command says it is in progress.

The checker is also run on a page that names what does not exist, so a checker that passes everything fails here.
"""

from __future__ import annotations

import re

from support.layers import PODS

ROOT = PODS.parent
STATUS = ROOT / "docs" / "status.md"
MAKEFILE = (ROOT / "Makefile").read_text()
HEADER = "claim / figure"
TICKED = re.compile(r"`([^`]+)`")

FIGS = set(re.findall(r"^FIG_([\w.-]+)\s*=", MAKEFILE, flags=re.M))
TARGETS = set(re.findall(r"^([\w.-]+)\s*:(?!=)", MAKEFILE, flags=re.M))


def rows(text: str) -> list[list[str]]:
    """The body rows (lists of cells) of every table in ``text`` whose header's first cell is ``claim / figure``."""
    out, inside = [], False
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            inside = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == HEADER:
            inside = True
        elif inside and not set(cells[0]) <= set("-: "):
            out.append(cells)
    return out


def module_runs(name: str) -> bool:
    """``python -m name`` can run: a module file, or a package with a ``__main__``."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def command_problems(command: str) -> list[str]:
    """What in one command does not exist (empty: it does)."""
    words = command.split()
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # OMP_NUM_THREADS=1 python ...
        words = words[1:]
    if not words:
        return [f"{command!r}: not a command"]
    bad = []
    for word in words:
        if word.startswith("experiment=") and not (ROOT / "conf" / "experiment" / f"{word.split('=', 1)[1]}.yaml").is_file():
            bad.append(f"{command!r}: no conf/experiment/ file for {word}")
        if word.startswith("+sweep=") and not (ROOT / "conf" / "sweep" / f"{word.split('=', 1)[1]}.yaml").is_file():
            bad.append(f"{command!r}: no conf/sweep/ file for {word}")
    head, rest = words[0], words[1:]
    if head == "make":
        figs = [w.split("=", 1)[1] for w in rest if w.startswith("FIG=")]
        names = [w for w in rest if "=" not in w and not w.startswith("-")]
        bad += [f"{command!r}: no FIG {f}" for f in figs if f not in FIGS and f.removesuffix("-plot") not in FIGS]
        bad += [f"{command!r}: no make target {t}" for t in names if t not in TARGETS]
    elif head == "python" and rest[:1] == ["-m"]:
        if len(rest) < 2 or not module_runs(rest[1]):
            bad.append(f"{command!r}: no runnable module {rest[1:2]}")
    elif head == "python":
        if not rest or not (ROOT / rest[0]).is_file():
            bad.append(f"{command!r}: no script {rest[:1]}")
    elif "/" in head:
        if not (ROOT / head).is_file():
            bad.append(f"{command!r}: no script {head}")
    else:
        bad.append(f"{command!r}: not a make, python or script command")
    return bad


def problems(text: str) -> list[str]:
    """Everything wrong with a status page: rows with an empty column or no command, commands naming what does not
    exist, ``results/`` paths that do not exist, and FIG names without a row."""
    bad, table = [], rows(text)
    if not table:
        return [f"no table whose first column is '{HEADER}'"]
    named = set()
    for row in table:
        if len(row) != 5 or not all(row):
            bad.append(f"row {row[0]!r}: {len(row)} columns, every one of the 5 filled is asked")
            continue
        commands = TICKED.findall(row[4])
        if not commands and "in progress" not in row[4]:
            bad.append(f"row {row[0]!r}: no command and not in progress")
        for command in commands:
            bad += command_problems(command)
            named |= {w.split("=", 1)[1] for w in command.split() if w.startswith("FIG=")}
    for path in {t.rstrip(".,;") for t in TICKED.findall(text) if t.startswith("results/")}:
        if not any(ROOT.glob(path.rstrip("/"))):
            bad.append(f"{path}: does not exist")
    bad += [f"make reproduce FIG={f} has no row" for f in sorted(FIGS) if not f.endswith("-plot") and f not in named]
    return bad


def test_the_makefile_is_read():
    assert {"cpu", "3", "4-n", "figure1-cpu"} <= FIGS and len(FIGS) >= 15, sorted(FIGS)
    assert {"demo", "reproduce", "gpu-check", "test"} <= TARGETS, sorted(TARGETS)


def test_status_page_is_whole_and_its_commands_exist():
    bad = problems(STATUS.read_text())
    assert not bad, "docs/status.md:\n" + "\n".join(bad)


def test_status_page_keeps_the_claims_it_promises():
    firsts = " ".join(r[0] for r in rows(STATUS.read_text()))
    for claim in ("GRPO-GA", "GRPO n = m", "n sweep", "m sweep", "D3S speed", "Pass@1", "D3S outcome", "KV", "async vs sync"):
        assert claim in firsts, f"docs/status.md has no row for {claim!r}"


def test_readme_links_the_status_page():
    assert "(docs/status.md)" in (ROOT / "README.md").read_text()


def test_the_checker_finds_what_does_not_exist():
    page = "\n".join(
        [
            f"| {HEADER} | paper | cpu | gpu | command |",
            "|---|---|---|---|---|",
            "| a | 1 | 2 | 3 | `make reproduce FIG=no-such-figure`, `make no-such-target` |",
            "| b | 1 | 2 | 3 | `python -m pods.no_such_module`, `python scripts/no_such.py run`, `scripts/no_such.sh OUT` |",
            "| c | 1 | 2 | 3 | `python -m pods.train experiment=no_such_file +sweep=no_such_sweep` |",
            "| d | 1 | 2 | 3 | not a command |",
            "| e | 1 | | 3 | `make demo` |",
            "named `results/no_such_folder/`",
        ]
    )
    bad = problems(page)
    for needle in (
        "no FIG no-such-figure",
        "no make target no-such-target",
        "no runnable module",
        "no script ['scripts/no_such.py']",
        "no script scripts/no_such.sh",
        "no conf/experiment/ file",
        "no conf/sweep/ file",
        "row 'd': no command",
        "row 'e'",
        "results/no_such_folder/: does not exist",
        "make reproduce FIG=cpu has no row",
    ):
        assert any(needle in b for b in bad), f"the checker missed {needle!r}: {bad}"
