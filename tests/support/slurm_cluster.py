"""A real SLURM cluster on this machine for tests: Debian's slurm-wlm + munge, daemons started by hand. One node
(``localhost``), or ``nodes=N``: N slurmd on this host as node1..nodeN (own names, ports, spool, pid and log files).

Everything lives in a temporary directory (config, munge key and socket, state, spool, logs, pid files) on
free ports, so it never touches a system SLURM and two clusters can coexist. ``stop()`` ends exactly the
daemons it started, by the pids in their pid files. The node advertises ``Gres=gpu:8`` without device files
(counts only), so the sbatch scripts' real ``--gpus-per-node`` lines are accepted; there is no GPU behind them.

    with LocalCluster() as c:          # or: python tests/support/slurm_cluster.py  (starts one, prints SLURM_CONF, waits)
        c.run(["sbatch", "--wrap", "hostname"])
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from pods.distributed import free_port

PACKAGES = ["slurm-wlm", "munge"]
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
BINARIES = ["slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel"]


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def install_reason() -> str | None:
    """None when SLURM is here; else, only with PODS_INSTALL_SLURM=1 (``.ci/run`` sets it), install slurm-wlm + munge
    with apt-get. Returns why the cluster cannot start (the ``slurm`` tests skip saying so), or None when ready."""
    if not missing_binaries():
        return None
    if os.environ.get("PODS_INSTALL_SLURM") != "1":
        return f"SLURM ({', '.join(missing_binaries())}) is not installed: install slurm-wlm and munge, or set PODS_INSTALL_SLURM=1 to let the tests apt-get them"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"SLURM ({', '.join(missing_binaries())}) is not installed and this machine cannot install Debian packages (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if p.returncode != 0:
            return f"cannot install Debian packages {PACKAGES}: `{' '.join(cmd)}` failed: {p.stderr.strip()[-300:]}"
    return None if not missing_binaries() else f"installed {PACKAGES} but still missing {missing_binaries()}"


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class LocalCluster:
    def __init__(self, cpus: int | None = None, mem_mb: int = 8000, gpus: int = 8, nodes: int = 1):
        self.cpus = cpus or os.cpu_count() or 2  # per node
        # nodes > 1: one slurmd per node, all on this host, each with its own name, port, spool, pid and log file
        self.nodes = ["localhost"] if nodes == 1 else [f"node{i}" for i in range(1, nodes + 1)]
        self.mem_mb, self.gpus = mem_mb, gpus
        self.dir = Path(tempfile.mkdtemp(prefix="pods-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._pidfiles: list[Path] = []

    # ---- lifecycle ----------------------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> LocalCluster:
        d = self.dir
        d.chmod(0o711)  # munged checks that every directory above its socket is searchable by all
        for sub in ("state", "spool", "log", "munge", "dev"):
            (d / sub).mkdir()
        (d / "munge").chmod(0o711)  # munged: the socket's directory must be searchable by all
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = d / "munge" / "munge.socket"
        self._daemon(
            [
                _sbin("munged"),
                "--force",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={d / 'munge' / 'munged.pid'}",
                f"--log-file={d / 'log' / 'munged.log'}",
                f"--seed-file={d / 'munge' / 'munged.seed'}",
            ],
            d / "munge" / "munged.pid",
        )
        self._write_conf(sock)
        self._daemon([_sbin("slurmctld"), "-f", str(self.conf)], d / "slurmctld.pid")
        for node in self.nodes:
            (d / "spool" / node).mkdir()
            self._daemon([_sbin("slurmd"), "-f", str(self.conf), "-N", node], d / f"slurmd.{node}.pid")
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False)
            states = p.stdout.split()
            if p.returncode == 0 and len(states) == len(self.nodes) and all(s in ("idle", "mixed", "allocated") for s in states):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"local SLURM did not come up in {timeout:.0f} s; logs in {d / 'log'}:\n{self.logs()}")

    def stop(self) -> None:
        """Stop the daemons this object started, by their pids (slurmd, slurmctld, then munged)."""
        for pidfile in reversed(self._pidfiles):
            pid = self._pid(pidfile)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                if not self._alive(pid):
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- use ----------------------------------------------------------------------------------------------
    def run(self, cmd: list[str], check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        p = subprocess.run(cmd, capture_output=True, text=True, env={**self.env, **kw.pop("env", {})}, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
        return p

    def job(self, job_id: str) -> dict:
        """scontrol's view of a job as a dict (JobState, Restarts, ExitCode, ...); {} if scontrol did not answer."""
        p = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        return dict(f.split("=", 1) for f in p.stdout.split() if "=" in f) if p.returncode == 0 else {}

    def state(self, job_id: str) -> str:
        """PENDING, RUNNING, COMPLETED, FAILED, ... (accounting is off, so from scontrol; UNKNOWN if no answer)."""
        return self.job(job_id).get("JobState", "UNKNOWN")

    def wait(self, job_id: str, timeout: float = 180) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.state(job_id)
            if s in FINAL:
                return s
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} still {self.state(job_id)} after {timeout:.0f} s")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.dir / "log").glob("*.log")))

    # ---- internals ----------------------------------------------------------------------------------------
    def _daemon(self, cmd: list[str], pidfile: Path) -> None:
        self._pidfiles.append(pidfile)
        p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()}\n{self.logs()}")
        for _ in range(100):
            if self._pid(pidfile):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{cmd[0]} wrote no pid file {pidfile}\n{self.logs()}")

    @staticmethod
    def _alive(pid: int) -> bool:
        """Running (an exited daemon whose parent has not reaped it yet is a zombie: not alive)."""
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    @staticmethod
    def _pid(pidfile: Path) -> int | None:
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _write_conf(self, munge_socket: Path) -> None:
        d = self.dir
        lines = [
            "ClusterName=podstest",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket},cred_expire=10",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1",  # with cred_expire=10: a requeued job restarts ~11 s later
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "KillWait=10",
            "MinJobAge=600",
            "GresTypes=gpu",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.%n.pid'}",  # %n: the node's name
            f"SlurmdSpoolDir={d / 'spool' / '%n'}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd.%n.log'}",
            *(
                f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} CPUs={self.cpus} Boards=1 "
                f"SocketsPerBoard=1 CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory={self.mem_mb} Gres=gpu:{self.gpus} State=UNKNOWN"
                for node in self.nodes
            ),
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        for i in range(self.gpus):  # stand-in device files: slurmd counts GPUs by their File= entries
            (d / "dev" / f"gpu{i}").touch()
        (d / "gres.conf").write_text(f"NodeName={','.join(self.nodes)} Name=gpu File={d / 'dev'}/gpu[0-{self.gpus - 1}]\n")


if __name__ == "__main__":  # a cluster to play with: python tests/support/slurm_cluster.py; stop it with Ctrl-C or kill PID
    reason = install_reason()
    if reason:
        raise SystemExit(reason)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    with LocalCluster() as c:
        print(f"export SLURM_CONF={c.conf}   # pid {os.getpid()}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


def started(nodes: int = 1):
    """The body of a test module's cluster fixture (``yield from started()``): skip, saying why, where no cluster can
    start here; else a 2-CPU, 8-GPU ``LocalCluster`` of ``nodes`` nodes for the module's tests."""
    import pytest

    reason = install_reason()
    if reason:
        pytest.skip(reason)
    with LocalCluster(cpus=2, mem_mb=8000, gpus=8, nodes=nodes) as c:
        yield c
