"""Step-time breakdown and per-rank memory of the multi-process path on CPU (DeepSpeed ZeRO-3, gloo).

Run alone (the 2-core machine is shared; other jobs distort the times, ``load_1m`` records the load average at
the start of each run): ``python benchmarks/bench_deepspeed.py [--steps 8] [--repeats 3] [--engines hf,vllm]``
(~10 min per repeat). Writes ``results/bench/deepspeed.csv`` (medians over the repeats) and prints it.

Every cell is a real training run of ``pods.loop.train`` on the tiny model, launched with torchrun and
measured from the loop's own per-step metrics (medians over the steps after the first 2):
- settings: ``local`` 1 process (LocalBackend), ``zero3`` 1 process, ``zero3`` 2 processes (cpu_ddp2_zero3),
  1 thread per process; 2 prompts per rank per step, so 2 processes do twice the work per step: compare
  ``rollouts_per_s`` (2 processes use both cores).
- algorithms, with the same micro-batch of 8 sequences: PODS n=32 -> m=8 (one micro-batch per prompt) vs
  GRPO-GA n=32 in micro-batches of 8 (4 per prompt): the same rollouts generated, 4x the sequences trained;
  and, for memory, GRPO n=32 trained in one pass per step (what GRPO-GA's micro-batching avoids).
- engines: ``hf`` generates with the live (ZeRO-3-partitioned) module, so nothing to sync; ``vllm`` is one
  in-process vLLM per rank, synced after every step from ZeRO-3 gathered layer by layer (``sync_s``).
- columns: ``generate_s``, ``gather_select_s`` (the reward all_gather + down-sampling), ``update_s``,
  ``sync_s`` are the loop's t_* (the slowest rank's); ``step_s`` the step's training-clock time.
  Memory per rank: ``peak_rss_mb`` (process RSS high-water mark during the steps, polled every 2 ms),
  ``update_rss_mb`` (RSS rise over the update), ``saved_act_mb`` (peak bytes autograd saved for backward in
  one micro-batch: the activation memory micro-batching bounds), ``param_mb`` (this rank's share of the
  fp32 parameters: ZeRO-3 halves it over 2 ranks).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script without installing the package
OUT = ROOT / "results" / "bench" / "deepspeed.csv"
ALGOS = {  # the same 8-sequence micro-batch, except the reference that trains all 32 rollouts of a prompt in one pass
    "pods_32_8": ["algorithm=grpo_pods", "algorithm.n=32", "algorithm.m=8", "hardware.micro_batch_size=8"],
    "grpo_ga_32x8": ["algorithm=grpo_ga", "algorithm.n=32", "algorithm.m=8", "hardware.micro_batch_size=8"],
    "grpo_32_one_pass": ["algorithm=grpo", "algorithm.n=32", "hardware.micro_batch_size=64"],
}
# profile, processes, threads per process. 1 thread everywhere: with 2 threads a single process swung 2-30x
# from step to step whenever other jobs shared the 2 cores (OpenMP threads waiting on a descheduled peer).
SETTINGS = {"local_1x1": ("cpu", 1, 1), "zero3_1x1": ("cpu_ddp2_zero3", 1, 1), "zero3_2x1": ("cpu_ddp2_zero3", 2, 1)}
VLLM = ["rollout=vllm", "rollout.kv_cache_gib=0.0625", "rollout.max_model_len=256"]
COLUMNS = [
    "engine",
    "setting",
    "algorithm",
    "processes",
    "threads",
    "runs",
    "load_1m",
    "steps",
    "step_s",
    "generate_s",
    "gather_select_s",
    "update_s",
    "sync_s",
    "rollouts_per_s",
    "peak_rss_mb",
    "update_rss_mb",
    "saved_act_mb",
    "param_mb",
]


# ---- inside each rank -----------------------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rank_main(cfg_json: str, run_dir: str) -> None:
    """Train with memory instrumentation wrapped around Backend.update (the loop itself is untouched)."""
    import torch

    from pods.backends.base import Backend
    from pods.config import validate
    from pods.loop import train

    cfg = validate(json.loads(cfg_json))
    mem = {"peak_rss_mb": 0.0, "update_rss_mb": 0.0, "saved_act_mb": 0.0, "param_mb": 0.0}
    window = {"max": 0.0, "on": True}  # RSS high-water mark since the current update began

    def poll() -> None:
        while window["on"]:
            rss = _rss_mb()
            mem["peak_rss_mb"], window["max"] = max(mem["peak_rss_mb"], rss), max(window["max"], rss)
            time.sleep(0.002)

    real_update = Backend.update

    def update(self, batch, lr, **kw):
        saved = {"now": 0}

        def pack(t):
            saved["now"] += t.numel() * t.element_size()
            mem["saved_act_mb"] = max(mem["saved_act_mb"], saved["now"] / 2**20)
            return t

        def backward(loss, _orig=self.backward):
            _orig(loss)
            saved["now"] = 0  # a micro-batch's saved tensors are freed by its backward

        if not mem["param_mb"]:  # this rank's fp32 parameter share (ZeRO-3: the partition ds_tensor)
            mem["param_mb"] = sum((p.ds_tensor if hasattr(p, "ds_tensor") else p).numel() * 4 for p in self.policy.parameters()) / 2**20
        before = window["max"] = _rss_mb()
        self.backward = backward
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                return real_update(self, batch, lr, **kw)
        finally:
            del self.backward
            mem["update_rss_mb"] = max(mem["update_rss_mb"], window["max"] - before)

    Backend.update = update
    threading.Thread(target=poll, daemon=True).start()
    train(cfg, run_dir)
    window["on"] = False
    (Path(run_dir) / f"mem_rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(mem))


# ---- the driver -------------------------------------------------------------------------------------------
def compose_cfg(profile: str, threads: int, algo: list[str], engine: str, steps: int) -> dict:
    from pods.compose import compose_plain

    overrides = [
        f"hardware={profile}",
        f"hardware.torch_threads={threads}",
        *algo,
        "train.prompts_per_step=2",
        f"train.max_steps={steps}",
        "train.time_budget_s=null",
        "train.checkpoint_at_end=false",
        "eval.at_start=false",
        "eval.every_s=null",
        "eval.max_examples=2",
        "eval.repeats=1",
        "sampling.max_tokens=12",
        "logger=none",
        *(VLLM if engine == "vllm" else []),
    ]
    return compose_plain(overrides)


def launch(cfg: dict, procs: int, threads: int, run_dir: Path) -> None:
    from pods.distributed import free_port

    port = free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"),
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "ERROR",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(procs),
        "--master_port",
        str(port),
        __file__,
        "--rank-main",
        json.dumps(cfg),
        str(run_dir),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    (run_dir / "launch.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"run failed: {run_dir / 'launch.log'}\n{proc.stderr[-2000:]}")


def summarize(run_dir: Path, warmup: int = 2) -> dict:
    """Medians over the steps after ``warmup``; memory: the largest rank's."""
    from pods.metrics import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    steps = [b["train_time"] - a["train_time"] for a, b in zip(rows[warmup - 1 :], rows[warmup:])]
    rows = rows[warmup:]
    mems = [json.loads(p.read_text()) for p in sorted(run_dir.glob("mem_rank*.json"))]
    out = {"steps": len(rows), "step_s": statistics.median(steps)}
    for col, key in (("generate_s", "t_generate"), ("gather_select_s", "t_select"), ("update_s", "t_update"), ("sync_s", "t_sync")):
        out[col] = statistics.median(r[key] for r in rows)
    for col in ("peak_rss_mb", "update_rss_mb", "saved_act_mb", "param_mb"):
        out[col] = max(m[col] for m in mems)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--algorithms", default=",".join(ALGOS))
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "bench_deepspeed"))
    args = ap.parse_args()
    import shutil

    from pods.tiny import ensure_tiny

    ensure_tiny()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    results: dict[tuple, list[dict]] = {}
    for rep in range(args.repeats):  # interleaved: every cell once per repeat
        for engine in args.engines.split(","):
            for setting in args.settings.split(","):
                profile, procs, threads = SETTINGS[setting]
                for algo in args.algorithms.split(","):
                    overrides = ALGOS[algo]
                    run_dir = work / f"{engine}_{setting}_{algo}_r{rep}"
                    run_dir.mkdir(parents=True)
                    cfg = compose_cfg(profile, threads, overrides, engine, args.steps)
                    clock, load = time.time(), os.getloadavg()[0]  # other jobs on the machine show here
                    try:
                        launch(cfg, procs, threads, run_dir)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:  # one broken cell must not lose the others
                        print(f"[bench] {engine} {setting} {algo} r{rep}: FAILED ({str(e).splitlines()[0]})", flush=True)
                        continue
                    res = summarize(run_dir)
                    res["load_1m"] = load
                    res["rollouts_per_s"] = procs * 2 * cfg["algorithm"]["n"] / res["step_s"]
                    results.setdefault((engine, setting, algo, procs, threads), []).append(res)
                    print(
                        f"[bench] {engine} {setting} {algo} r{rep}: step {res['step_s']:.3f}s ({time.time() - clock:.0f}s wall)", flush=True
                    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for (engine, setting, algo, procs, threads), reps in results.items():
            row = {"engine": engine, "setting": setting, "algorithm": algo, "processes": procs, "threads": threads, "runs": len(reps)}
            for k in COLUMNS[6:]:
                v = statistics.median(r[k] for r in reps)
                row[k] = round(v, 4) if isinstance(v, float) else v
            w.writerow(row)
    print(OUT.read_text())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], sys.argv[3])
    else:
        main()
