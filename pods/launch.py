"""The one way pods starts training runs from Python (``pods.figures``, ``pods.demo``, ``make reproduce-figure-cpu``).

A ``Job`` is one ``pods.train`` run: its Hydra overrides and its run directory. ``launch(jobs, launcher)``:

- ``local``: runs them here, ``parallel`` at a time (torchrun when ``nproc`` > 1), and returns when all have
  finished; a failed run stops the launch of the rest, the running ones finish, then ``SystemExit``;
- ``slurm``: one GPU: a Hydra multirun through hydra-submitit-launcher (``hydra/launcher=<hydra_launcher>``),
  all submitted at once, each watched by its own process (returned: pass them to ``wait``); several GPUs: one
  ``slurm/run_8gpu.sbatch`` job each;
- ``submitit``: SLURM through plain submitit, without Hydra's launcher plug-in (hydra-submitit-launcher):
  one job per run, resources from its ``hardware.slurm`` block, the cluster from ``PODS_SLURM_*`` as
  ``conf/hydra/launcher/slurm.yaml`` reads them; ``PODS_SUBMITIT_CLUSTER=local`` runs the jobs as submitit's
  local subprocesses (what the tests use). Returned: pass them to ``wait``. No requeue: a run stopped by its
  time limit continues from its last checkpoint when launched again (``train.resume=auto``).

Every run directory gets ``launch.json``: ``{"status": "launched" | "finished" | "failed", "launcher", "pid",
"cmd"}``. ``reusable`` says whether a run may be taken instead of launched again: finished, or launched and still
running (a local process alive, or any SLURM submission: its queue owns it). A failed run, or a local one whose
process is gone, is launched again (with ``train.resume=auto`` it continues from its last checkpoint). Delete
``launch.json`` to run a SLURM run again. ``run_key`` names a run by its resolved config, so that figures that
contain the same run (Figs. 3, 4 and 5 all hold PODS 64->16 on GSM8K) share it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pods.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
BOOKKEEPING = ("hydra", "logger", "hardware.slurm", "train.resume")  # keys that never change a run's result


@dataclass
class Job:
    """One ``pods.train`` run: ``overrides``, ``run_dir``, ranks (``nproc`` > 1: torchrun / the 8-GPU script),
    a local run's log file (None: this terminal) and the name printed when it starts."""

    overrides: list[str]
    run_dir: Path
    nproc: int = 1
    log: Path | None = None
    name: str = ""
    python: str | None = None  # the job's interpreter; None: ``job_python`` decides (launch() fills it in)
    cmd: list[str] | None = None  # a command other than pods.train (pods-eval --each-checkpoint's jobs); overrides unused
    hardware: dict | None = None  # such a command's hardware section (its python, its resources); None: composed from overrides


def machine_load() -> str:
    """The 1/5/15-minute load averages and the core count, for every timing written."""
    return f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores"


# ---- run identity and state ----------------------------------------------------------------------------------
def run_key(cfg: dict) -> str:
    """12 hex digits of the SHA-256 of the resolved config (sorted JSON) without ``BOOKKEEPING``."""
    cfg = json.loads(json.dumps(cfg, default=str))
    for dotted in BOOKKEEPING:
        *parents, last = dotted.split(".")
        node = cfg
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]


def status(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "launch.json"
    return json.loads(path.read_text()) if path.exists() else None


def _alive(pid: int) -> bool:
    if pid <= 0:  # kill(0 or -1, ...) would address a whole process group
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OSError):
        return False
    return True


def reusable(run_dir: Path) -> bool:
    """True when the run finished, or was launched and is still running (see the module docstring)."""
    state = status(run_dir) or {}
    if state.get("status") == "finished":
        return True
    if state.get("status") == "launched":
        return state.get("launcher") == "slurm" or _alive(int(state.get("pid", 0)))
    return False


def mark(run_dir: Path, state: str, launcher: str, cmd: list[str]) -> None:
    """Write ``launch.json`` (the launching process's pid: a local run runs inside it)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "launch.json").write_text(json.dumps({"status": state, "launcher": launcher, "pid": os.getpid(), "cmd": cmd}, indent=1))


# ---- launchers -------------------------------------------------------------------------------------------------
LAUNCHERS = Registry("launcher")
TRAIN = ["-m", "pods.train"]  # after the job's python


def job_python(job: Job, env: dict | None = None) -> str:
    """The interpreter that runs ``job`` (and, on SLURM, submits it: submitit and hydra-submitit-launcher run a job with
    the submitting process's python): for a GPU profile (``hardware.device=cuda``) the GPU environment's
    (``pods.gpu_env.job_python``: ``GPU_PY``, else the active conda env; ``ConfigError`` without either), never the CPU
    ``.venv`` that may be running this; for a CPU run, this one."""
    from pods.gpu_env import job_python as python

    return python(_hardware(job)["device"] == "cuda", env)


def _hardware(job: Job) -> dict:
    """The job's hardware section: given (``Job.hardware``), else composed from its ``key=value`` overrides (flags such
    as ``--cfg job`` left to Hydra)."""
    if job.hardware is not None:
        return job.hardware
    from pods.compose import compose_plain

    return compose_plain([o for o in job.overrides if "=" in o and not o.startswith("-")])["hardware"]


def _started(job: Job, cmd: list[str], launcher: str, tag: str) -> None:
    name = f"{job.name} " if job.name else ""
    print(f"[{tag}] {name}({machine_load()}): {' '.join(cmd)}", flush=True)
    mark(job.run_dir, "launched", launcher, cmd)


def _local_cmd(job: Job) -> list[str]:
    if job.cmd:
        return job.cmd
    python = job.python or sys.executable
    ranks = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={job.nproc}", *TRAIN]
    return [python, *(ranks if job.nproc > 1 else TRAIN), *job.overrides, f"hydra.run.dir={job.run_dir}"]


def _sbatch_resources(job: Job) -> list[str]:
    """sbatch flags of a several-GPU run from its profile: its GPUs (``hardware.nproc_per_node``: a 4-GPU recipe asks
    for 4, and the script starts 4 ranks) and time (``hardware.slurm.timeout_min``), over the script's #SBATCH lines."""
    hw = _hardware(job)
    flags = [f"--gpus-per-node={hw['nproc_per_node']}"]
    minutes = (hw.get("slurm") or {}).get("timeout_min")
    return flags + ([f"--time={minutes}"] if minutes else [])


@LAUNCHERS.register("local")
def run_local(jobs: list[Job], parallel: int = 1, tag: str = "launch", **_) -> list[subprocess.Popen]:
    """Run ``jobs`` here, ``parallel`` at a time, in order; returns when every started run has ended."""
    running: list[tuple[Job, list[str], subprocess.Popen]] = []
    failed: list[str] = []
    for job in jobs:
        while len(running) >= parallel:
            running = _reap(running, failed)
        if failed:
            break
        cmd = _local_cmd(job)
        _started(job, cmd, "local", tag)
        log = job.log.open("w") if job.log else None
        running.append((job, cmd, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT if log else None)))
        if log:
            log.close()  # the child holds its own copy
    while running:
        running = _reap(running, failed)
    if failed:
        raise SystemExit(f"[{tag}] a run failed: {'; '.join(failed)}; the same command again continues it (with train.resume=auto)")
    return []


def _reap(running: list, failed: list[str]) -> list:
    """Mark the runs that ended (finished / failed); the ones still running, after a short wait when none ended."""
    left = []
    for job, cmd, proc in running:
        rc = proc.poll()
        if rc is None:
            left.append((job, cmd, proc))
            continue
        mark(job.run_dir, "finished" if rc == 0 else "failed", "local", cmd)
        if rc:
            failed.append(f"{job.run_dir} (exit {rc})")
    if len(left) == len(running):
        time.sleep(0.2)
    return left


@LAUNCHERS.register("slurm")
def submit_slurm(jobs: list[Job], hydra_launcher: str = "slurm", tag: str = "launch", **_) -> list[subprocess.Popen]:
    """Submit ``jobs`` to SLURM; returns the processes that wait for the one-GPU job arrays (see ``wait``)."""
    procs = []
    for job in jobs:
        if job.nproc > 1:  # the script runs torchrun over the node's GPUs into PODS_RUN_DIR
            exp = next((o.split("=", 1)[1] for o in job.overrides if o.startswith("experiment=")), "run")
            script = str(ROOT / "slurm" / "run_8gpu.sbatch")
            cmd = ["sbatch", "--parsable", f"--job-name=pods-{exp}", *_sbatch_resources(job), script, *job.overrides]
            _started(job, cmd, "slurm", tag)
            env = {**os.environ, "PODS_ROOT": str(ROOT), "PODS_RUN_DIR": str(job.run_dir), "PODS_PYTHON": job.python or sys.executable}
            subprocess.run(cmd, cwd=ROOT, check=True, env=env)
            continue
        place = [f"hydra.sweep.dir={job.run_dir.parent}", f"hydra.sweep.subdir={job.run_dir.name}"]
        cmd = [job.python or sys.executable, *TRAIN, "-m", *job.overrides, *place, f"hydra/launcher={hydra_launcher}"]
        _started(job, cmd, "slurm", tag)
        procs.append(subprocess.Popen(cmd, cwd=ROOT))
    return procs


@dataclass
class _Command:
    """What a plain-submitit job runs: one ``pods.train`` command in the repository (its output: the job's log)."""

    cmd: list[str]

    def __call__(self) -> None:
        subprocess.run(self.cmd, cwd=ROOT, check=True)


@dataclass
class Submitted:
    """A run submitted through plain submitit; ``wait()`` marks its ``launch.json`` and returns 0 when it finished."""

    handle: object  # submitit.Job
    job: Job
    cmd: list[str]
    launcher: str

    def wait(self) -> int:
        try:
            self.handle.result()
        except Exception as e:  # submitit's FailedJobError carries the job's log tail
            print(f"[launch] {self.job.run_dir} failed: {(str(e).strip() or type(e).__name__).splitlines()[-1]}", flush=True)
            mark(self.job.run_dir, "failed", self.launcher, self.cmd)
            return 1
        mark(self.job.run_dir, "finished", self.launcher, self.cmd)
        return 0


def _resources(job: Job) -> dict:
    """submitit parameters of one run: its ``hardware.slurm`` block, else conf/hydra/launcher/slurm.yaml's defaults
    (CPUs and memory: PODS_SLURM_CPUS, PODS_SLURM_MEM_GB as in slurm_cpu.yaml, else 2 and 8 GB)."""
    res = _hardware(job).get("slurm") or {}
    env = {k: os.environ.get(f"PODS_SLURM_{k.upper()}") for k in ("partition", "account", "qos", "setup")}
    params = {
        "name": f"pods-{job.run_dir.name}",
        "nodes": 1,
        "tasks_per_node": 1,
        "gpus_per_node": res.get("gpus_per_node") or None,  # none asked: no --gpus-per-node line
        "cpus_per_task": res.get("cpus_per_task") or int(os.environ.get("PODS_SLURM_CPUS") or 2),
        "mem_gb": res.get("mem_gb") or float(os.environ.get("PODS_SLURM_MEM_GB") or 8),
        "timeout_min": res.get("timeout_min") or 60,
        "stderr_to_stdout": True,
        "slurm_constraint": res.get("constraint"),
        "slurm_setup": [env["setup"]] if env["setup"] else None,
        **{f"slurm_{k}": env[k] for k in ("partition", "account", "qos")},
    }
    return {k: v for k, v in params.items() if v is not None}


@LAUNCHERS.register("submitit")
def submit_submitit(jobs: list[Job], tag: str = "launch", **_) -> list[Submitted]:
    """Submit ``jobs`` through plain submitit (see the module docstring); returns them (see ``wait``)."""
    import submitit

    cluster = os.environ.get("PODS_SUBMITIT_CLUSTER", "slurm")
    launcher = "slurm" if cluster == "slurm" else "local"  # a SLURM run belongs to its queue (``reusable``)
    submitted = []
    for job in jobs:
        python = {"slurm_python": job.python} if cluster == "slurm" and job.python else {}  # the job's wrapper: the job's python
        executor = submitit.AutoExecutor(folder=job.run_dir.parent / ".submitit" / "%j", cluster=cluster, **python)
        executor.update_parameters(**_resources(job))
        cmd = _local_cmd(job)
        _started(job, cmd, launcher, tag)
        submitted.append(Submitted(executor.submit(_Command(cmd)), job, cmd, launcher))
    return submitted


def launch(jobs: list[Job], launcher: str = "local", parallel: int = 1, hydra_launcher: str = "slurm", tag: str = "launch") -> list:
    """Start ``jobs`` with ``LAUNCHERS[launcher]`` (see the module docstring); returns the processes left to ``wait`` for.
    Every job's python is decided first (``job_python``): a GPU job without a GPU python is refused (one line, exit 2)
    before anything starts."""
    from pods.errors import ConfigError

    run = LAUNCHERS.get(launcher)
    try:
        for job in jobs:
            job.python = job.python or job_python(job)
    except ConfigError as e:
        print(f"pods: config error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    return run(jobs, parallel=parallel, hydra_launcher=hydra_launcher, tag=tag)


def wait(procs: list[subprocess.Popen | Submitted], tag: str = "launch") -> None:
    """Wait for every submitting process or submitted run; ``SystemExit`` when one of their runs failed."""
    if any([p.wait() != 0 for p in procs]):  # a list: wait for every one before deciding
        raise SystemExit(f"[{tag}] a sweep failed; the same command again continues unfinished runs (train.resume=auto)")
