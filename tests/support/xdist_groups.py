"""Worker groups for ``pytest -n N --dist loadgroup`` (``make test-all``), registered by tests/conftest.py when
pytest-xdist is installed.

xdist's own ``loadgroup`` reads an ``xdist_group`` mark by renaming each test ``<nodeid>@<group>``, which pytest 9.2
no longer allows (``Node.nodeid`` is derived, not stored), so its groups are silently lost. Here each worker writes
the group of every test it collected (``group_of``) to ``<dir>/<worker>.json``, the directory named by the controller
in each worker's ``workerinput``; the controller's scheduler reads them when it first splits the tests into units,
after every worker has sent its collection (each writes its file before sending). A test without a group is its own
unit, given to whichever worker is free.

The units are handed out heaviest first (``cost_of``: a rough estimate of seconds from the test's markers, summed over
the unit), so the long SLURM, DeepSpeed and vLLM units start while there is still work for the other worker, and the
many one-second tests fill in at the end: two workers finish close together instead of one waiting on the other's
last long test.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

KEY = "pods_xdist_groups"
# fixtures of these scopes are built once per worker process: the tests that share one go to the same worker
SHARED_SCOPES = ("module", "class", "package")


def group_of(item: pytest.Item) -> str | None:
    """Every ``slurm`` test in one group (one local cluster at a time, and CI's apt-get of slurm-wlm + munge runs
    once, never twice at once under dpkg's lock); a test that uses a module-scoped fixture (a training run, a
    DeepSpeed launch, a vLLM engine) with the other tests of its module that use one, so the fixture is built once,
    not once per worker; any other test: None."""
    if item.get_closest_marker("slurm") is not None:
        return "slurm"
    defs = item._fixtureinfo.name2fixturedefs.values()
    if any(d and d[-1].scope in SHARED_SCOPES for d in defs):
        return item.nodeid.split("::", 1)[0]
    return None


# rough seconds per test by marker (measured order of magnitude here: slurm tests 40-250 s, slow 20-150 s, others ~1 s)
COSTS = {"slurm": 100.0, "slow": 30.0}


def cost_of(item: pytest.Item) -> float:
    """The estimated cost of a test: its heaviest marker's ``COSTS`` entry, else 1."""
    return max((c for m, c in COSTS.items() if item.get_closest_marker(m) is not None), default=1.0)


class GroupScheduling(LoadScopeScheduling):
    """xdist's load-by-scope scheduler whose scope of a test is its group from the workers' files (else the test)."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        self.dir = Path(config.stash[DIR])
        self.groups: dict[str, str] | None = None
        self.costs: dict[str, float] = {}
        self.ordered = False

    def _split_scope(self, nodeid: str) -> str:
        if self.groups is None:  # first called by schedule(), once every worker has sent its collection
            self.groups = {}
            for path in sorted(self.dir.glob("*.json")):
                seen = json.loads(path.read_text())
                self.groups.update(seen["groups"])
                self.costs.update(seen["costs"])
        return self.groups.get(nodeid, nodeid)

    def _assign_work_unit(self, node) -> None:
        if not self.ordered:  # the first hand-out, right after schedule() built the queue: heaviest units first (stable)
            self.ordered = True
            units = sorted(self.workqueue.items(), key=lambda u: -sum(self.costs.get(n, 1.0) for n in u[1]))
            self.workqueue.clear()
            self.workqueue.update(units)
        super()._assign_work_unit(node)


DIR = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "loadgroup":
        config.stash[DIR] = tempfile.mkdtemp(prefix="pods-xdist-groups-")


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if DIR in config.stash:
        return GroupScheduling(config, log)
    return None


def pytest_configure_node(node) -> None:
    if DIR in node.config.stash:
        node.workerinput[KEY] = node.config.stash[DIR]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    where = getattr(config, "workerinput", {}).get(KEY)
    if where:
        groups = {item.nodeid: g for item in items if (g := group_of(item)) is not None}
        costs = {item.nodeid: c for item in items if (c := cost_of(item)) != 1.0}
        Path(where, f"{config.workerinput['workerid']}.json").write_text(json.dumps({"groups": groups, "costs": costs}))


def pytest_unconfigure(config: pytest.Config) -> None:
    if DIR in config.stash:
        shutil.rmtree(config.stash[DIR], ignore_errors=True)
