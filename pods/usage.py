"""``python -m pods.train --help``: the pods page (the command, the groups and their options, the sections' keys, the
experiment names, how runs and sweeps are kept, where the docs are), read from the shipped ``conf/`` tree and the
schema, instead of Hydra's page (its own options and a dump of every key; ``--hydra-help`` still shows it)."""

from __future__ import annotations

import textwrap
from pathlib import Path

CONF = Path(__file__).resolve().parent / "conf"
GROUPS = ("model", "dataset", "rollout", "hardware", "algorithm", "logger")  # what conf/config.yaml's defaults pick
SECTIONS = ("train", "sampling", "optim", "eval")  # the keys set one by one (their groups' keys: pods/schema/)


def options(group: str) -> list[str]:
    """The options of a ``conf/`` group (its yaml files; ``_``-files are schema parts, not options)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))


def keys(section: str) -> list[str]:
    from pods.schema.sections import Root

    model = Root.model_fields[section].annotation
    return list(model.model_fields)


def wrapped(head: str, names: list[str]) -> str:
    return textwrap.fill(", ".join(names), width=118, initial_indent=f"  {head:<11}", subsequent_indent=" " * 13)


def page() -> str:
    groups = "\n".join(wrapped(g, options(g)) for g in GROUPS)
    sections = "\n".join(wrapped(s, keys(s)) for s in SECTIONS)
    return f"""usage: python -m pods.train [experiment=NAME] [GROUP=OPTION ...] [KEY=VALUE ...]     (pods-train: the same)
       python -m pods.train -m KEY=A,B [KEY=C,D ...]      a sweep: one run per combination (Hydra multirun)

Trains one run into hydra.run.dir (default runs/<date>/<time>_<algorithm>_n<n>_m<m>), or with -m one run per
combination into hydra.sweep.dir/<num>_<overrides>. A bad key or value stops it in one line before anything loads.

Groups (GROUP=OPTION; conf/<group>/):
{groups}
Sections (KEY=VALUE, e.g. train.max_steps=20; each key's type, range and default: pods/schema/sections.py):
{sections}
  seed       the run's seed (0 .. 2147483647)
Experiments (experiment=NAME; conf/experiment/, each file's first comment is its command):
{wrapped("", options("experiment"))}
Sweeps (+sweep=NAME with an experiment; conf/sweep/): {", ".join(options("sweep"))}

A run directory holds one run. Again into the same directory:
  train.resume=auto        continue it from its latest checkpoint (a finished run: nothing to do)
  train.start_over=true    move it aside to <dir>.old<k> and start again there (nothing is deleted)
  otherwise                refused in one line; name another hydra.run.dir (a sweep: hydra.sweep.dir)
Ctrl-C or SIGTERM: checkpoint after the step under way, then stop (Ctrl-C again: abort without a checkpoint).

More: README.md (commands, sweeps, resuming), docs/knobs.md (every knob), docs/reproduce.md (the paper's runs).
  python -m pods.train --cfg job [overrides]   the composed config
  python -m pods.train --hydra-help            Hydra's own options"""
