"""``pods.launch``'s ``submitit`` launcher as a user without hydra-submitit-launcher runs it: a child process (and every
process it starts: the submitit job, its ``pods.train``) whose ``sitecustomize`` makes ``hydra_plugins`` unimportable, as
if no Hydra plug-in were installed (here the namespace holds only hydra-submitit-launcher; Hydra then finds none).
Each process of the tree says so once on stderr. Used by tests/e2e/test_launch.py (submitit's local executor) and
tests/slurm/test_slurm.py (a real local SLURM)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.config import ROOT

TRAIN = ["algorithm=grpo_ga", "algorithm.n=8", "algorithm.m=4", "train.max_steps=2", "train.time_budget_s=null", "train.prompts_per_step=1"]
TRAIN += ["eval.max_examples=8", "eval.repeats=1", "eval.every_s=null"]
HIDDEN = "[hidden] hydra_plugins in pid"

HIDE_PLUGINS = f"""
import importlib.abc, os, sys
class _Hide(importlib.abc.MetaPathFinder):
    said = False
    def find_spec(self, name, path=None, target=None):
        if name == "hydra_plugins" or name.startswith("hydra_plugins."):
            if not _Hide.said:
                _Hide.said = True
                print(f"{HIDDEN} {{os.getpid()}}", file=sys.stderr, flush=True)
            raise ImportError(f"{{name}}: hidden (no Hydra plug-in installed)")
sys.meta_path.insert(0, _Hide())
"""

SUBMIT = """
import sys
from pathlib import Path
try:
    import hydra_plugins.hydra_submitit_launcher
    sys.exit("hydra-submitit-launcher is importable")
except ImportError:
    pass
from pods import launch
procs = launch.launch([launch.Job(sys.argv[2:], Path(sys.argv[1]), name="plain")], "submitit", tag="t")
launch.wait(procs, "t")
"""


def submit_without_plugin(run_dir: Path, tmp_path: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    """``launch([Job(TRAIN, run_dir)], "submitit")`` and ``wait`` in a child process without hydra-submitit-launcher."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text(HIDE_PLUGINS)
    pythonpath = os.pathsep.join(p for p in (str(hide), env.get("PYTHONPATH")) if p)
    env = {**env, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, "-c", SUBMIT, str(run_dir), *TRAIN]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
