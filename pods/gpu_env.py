"""What a GPU run needs of the Python environment it runs in, checked before any model loads.

- A C compiler and Python's headers for a CUDA run of vLLM. vLLM's CUDA engine runs Triton kernels from its first
  warm-up, and Triton builds its launcher (a small C extension) on first use with ``$CC``, else ``gcc``, else
  ``clang``, against ``Python.h`` of the running interpreter (``triton/runtime/build.py``). Both environment files
  install conda-forge's ``c-compiler``; its activation sets ``CC``. ``check_c_compiler`` refuses the run in one line
  when the compile Triton will do cannot work here.
- torch with CUDA. ``python -m pods.gpu_env`` prints the torch, CUDA, driver and cards this interpreter sees and
  exits 1 when it cannot use a GPU (a CPU build of torch, a driver too old for torch's CUDA, no device): the
  SLURM scripts and ``make gpu-check`` run it before any GPU work.
- The python of GPU jobs (``job_python``): ``GPU_PY``, else the active conda environment's, never a CPU build.
- The card's memory (``card_memory_gb``): what the visible device has, over the hardware profile's figure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from pods.errors import ConfigError

GB = 1e9  # as pods.memory
TRITON_ENGINES = frozenset({"vllm"})  # rollout engines whose CUDA build compiles Triton launchers at start
# Oldest driver for each CUDA major of torch's wheels (NVIDIA's CUDA toolkit release notes, table 3).
MIN_DRIVER = {13: "580.65.06", 12: "525.60.13"}
CARD_TOLERANCE = 0.10  # a card's marketed size vs its total_memory: an 80 GB H100 reports 85.0e9 B (+6%)


def c_compiler(env: dict | None = None) -> str | None:
    """The compiler Triton will use, resolved to a path: ``$CC``, else ``gcc``, else ``clang`` (None: none)."""
    env = os.environ if env is None else env
    path = env.get("PATH", os.defpath)
    if env.get("CC"):
        return shutil.which(env["CC"], path=path)
    return shutil.which("gcc", path=path) or shutil.which("clang", path=path)


def python_include() -> Path:
    """Where Triton looks for ``Python.h``: the running interpreter's include directory (Debian's scheme mapped)."""
    scheme = sysconfig.get_default_scheme()
    return Path(sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"])


def _conda_compiler() -> Path | None:
    """conda-forge's compiler of this environment, present even where the environment was not activated."""
    found = sorted(Path(sys.prefix, "bin").glob("*-conda-linux-gnu-cc"))
    return found[0] if found else None


def compiler_problem(env: dict | None = None, include: Path | None = None) -> str | None:
    """Why Triton could not build its launcher here (one line), or None: a compile of ``#include <Python.h>``."""
    env = os.environ if env is None else env
    include = python_include() if include is None else include
    cc = c_compiler(env)
    if cc is None:
        conda = _conda_compiler()
        hint = f"export CC={conda} (`conda activate` sets it)" if conda else "install one: conda install -c conda-forge c-compiler"
        named = f"CC={env['CC']} is not an executable" if env.get("CC") else "no C compiler (CC unset, no gcc or clang on PATH)"
        return f"{named}: {hint}"
    if not (include / "Python.h").is_file():
        return f"no Python.h in {include} for {sys.executable}: use environment.yml's python, or install the python dev headers"
    probe = subprocess.run(
        [cc, "-fsyntax-only", "-x", "c", f"-I{include}", "-"],
        input="#include <Python.h>\nint main(void) { return 0; }\n",
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=120,
    )
    if probe.returncode != 0:
        first = next((ln for ln in probe.stderr.splitlines() if ln.strip()), f"exit code {probe.returncode}")
        return f"{cc} cannot compile against {include}/Python.h: {first.strip()}"
    return None


def check_c_compiler(device: str, engine: str) -> None:
    """``ConfigError`` (one line) for a CUDA run of a Triton-compiling engine where the compile cannot work."""
    if device != "cuda" or engine not in TRITON_ENGINES:
        return
    problem = compiler_problem()
    if problem:
        raise ConfigError(
            f"rollout.name={engine} on hardware.device=cuda: vLLM's engine builds Triton launchers with a C compiler at start, and {problem}"
        )


def driver_version() -> str | None:
    """The NVIDIA driver's version per ``nvidia-smi`` (None without it)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = p.stdout.split()
    return lines[0] if p.returncode == 0 and lines else None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".") if x.isdigit())


def driver_advice(cuda: str, driver: str | None) -> str:
    """Why a CUDA build of torch sees no GPU, as far as the driver's version tells."""
    need = MIN_DRIVER.get(_version(cuda)[0]) if cuda else None
    if driver is None:
        return "nvidia-smi not found: no NVIDIA driver on this machine, or not on PATH"
    if need and _version(driver) < _version(need):
        return f"driver {driver} is older than CUDA {cuda} needs (>= {need}): use environment-cuda12.yml (driver >= 525.60.13) or update the driver"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    return f"driver {driver} is new enough; check CUDA_VISIBLE_DEVICES={visible} and the job's GPU request"


def cuda_report() -> tuple[bool, str]:
    """(usable, one line): the torch build, its CUDA, the driver and the cards this interpreter sees."""
    try:
        import torch
    except ImportError as e:
        return False, f"{sys.executable}: no torch ({e}): GPU work needs environment.yml's env (GPU_PY=<env>/bin/python)"
    where = f"{sys.executable}: torch {torch.__version__}"
    cuda = torch.version.cuda
    if cuda is None:
        return (
            False,
            f"{where} is a CPU build (no CUDA): GPU work needs environment.yml's env (GPU_PY=<env>/bin/python, or conda activate pods)",
        )
    if not torch.cuda.is_available():
        return False, f"{where} (CUDA {cuda}) sees no usable GPU: {driver_advice(cuda, driver_version())}"
    n, p = torch.cuda.device_count(), torch.cuda.get_device_properties(0)
    return True, f"{where}, CUDA {cuda}, driver {driver_version() or 'unknown'}: {n} x {p.name} ({p.total_memory / GB:.1f} GB)"


def job_python(gpu: bool, env: dict | None = None) -> str:
    """The interpreter that runs (and submits) a job. GPU jobs: ``GPU_PY``, else the active conda environment's
    python; a CPU build of torch there is refused by the job itself (``python -m pods.gpu_env``). Without either
    a GPU job raises ``ConfigError``: the running interpreter may be the CPU ``.venv``. CPU jobs: this one."""
    env = os.environ if env is None else env
    if not gpu:
        return sys.executable
    if env.get("GPU_PY"):
        return env["GPU_PY"]
    conda = Path(env.get("CONDA_PREFIX", ""), "bin", "python")
    if env.get("CONDA_PREFIX") and conda.exists():
        return str(conda)
    raise ConfigError(
        "GPU jobs need the GPU environment's python: set GPU_PY=/path/to/env/bin/python or activate environment.yml's env "
        "(conda activate pods); the running python may be the CPU .venv"
    )


def card_memory_gb(configured: float | None, device: int | None = None) -> float | None:
    """The memory (GB) a run should be checked against: the visible card's ``total_memory`` when there is one
    (a profile written for a 48 GB card must not pass on a 24 GB one), else ``hardware.gpu_memory_gb``."""
    import torch

    if not torch.cuda.is_available():
        return configured
    index = int(os.environ.get("LOCAL_RANK", "0")) if device is None else device
    props = torch.cuda.get_device_properties(index)
    real = props.total_memory / GB
    if configured is not None and abs(real - configured) > CARD_TOLERANCE * configured:
        from pods.log import get

        get(__name__).warning(f"hardware.gpu_memory_gb={configured:g} but {props.name} has {real:.1f} GB: checking against the card's")
    return real


def main() -> int:
    """``python -m pods.gpu_env``: one line about torch and CUDA here; exit 1 when no GPU can be used."""
    ok, line = cuda_report()
    print(f"[pods] {line}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
