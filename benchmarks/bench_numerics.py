"""Does the CPU numerics pin matter, and what does it cost? The same short training run (the tiny model's warm start,
``--steps`` steps of pods.tiny's builder, 1 thread) under different kernel settings, each in its own process:

- ``native``: no pin (PODS_NUMERICS=native): torch, MKL and oneDNN pick the best kernels this CPU has;
- ``aten=avx2`` / ``aten=avx512`` / ``aten=default``: no pin, only ATEN_CPU_CAPABILITY set;
- ``pinned``: ``pods.numerics.pin()`` (ATen AVX2, MKL_CBWR=AVX2, oneDNN at most AVX2).

Reports each setting's weight hash, the max |difference| of its weights from the pinned run's, and its seconds
(settings interleaved over ``--repeats`` rounds; the machine's load average is recorded: the 2-core machine is
shared). Run: ``python benchmarks/bench_numerics.py [--steps 60] [--repeats 3]`` (about 5 min) ->
``results/cpu/numerics/numerics.json`` and ``numerics.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "pinned": {},
    "native": {"PODS_NUMERICS": "native"},
    "aten=avx2": {"PODS_NUMERICS": "native", "ATEN_CPU_CAPABILITY": "avx2"},
    "aten=avx512": {"PODS_NUMERICS": "native", "ATEN_CPU_CAPABILITY": "avx512"},
    "aten=default": {"PODS_NUMERICS": "native", "ATEN_CPU_CAPABILITY": "default"},
}
NUMERIC_VARS = ("PODS_NUMERICS", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def worker(steps: int, out: str) -> None:
    """One warm start in this process (its numerics already set by the environment); saves the weights to ``out``."""
    from pods.numerics import pin

    pin()
    import torch
    from safetensors.torch import save_file

    from pods.numerics import record
    from pods.tiny import DEFAULT_SPEC, _train_tiny

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, _ = _train_tiny({**DEFAULT_SPEC, "warm_start_steps": steps})
    seconds = time.perf_counter() - t0
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, out)
    print(json.dumps({"seconds": seconds, "numerics": record()}))


def run_one(name: str, steps: int, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in NUMERIC_VARS}
    env.update(SETTINGS[name], OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, __file__, "--worker", "--steps", str(steps), "--out", str(out)]
    load = os.getloadavg()[0]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return {**json.loads(res.stdout.strip().splitlines()[-1]), "load_before": round(load, 2)}


def compare(files: dict[str, Path], ref: str) -> dict[str, dict]:
    """Per setting: weight hash, and max |w - w_ref| over all tensors (and the worst tensor)."""
    from safetensors.torch import load_file

    from pods.tiny import weights_hash

    want = load_file(str(files[ref]))
    out = {}
    for name, f in files.items():
        got = load_file(str(f))
        gaps = {k: float((got[k].double() - want[k].double()).abs().max()) for k in want}
        worst = max(gaps, key=gaps.get)
        f.parent.joinpath("model.safetensors").unlink(missing_ok=True)
        f.rename(f.parent / "model.safetensors")
        out[name] = {"hash": weights_hash(f.parent), "max_abs_diff_vs_pinned": gaps[worst], "worst_tensor": worst}
    return out


def measure(steps: int, repeats: int) -> dict:
    times: dict[str, list[float]] = {k: [] for k in SETTINGS}
    loads, rec = [], {}
    with tempfile.TemporaryDirectory(prefix="pods-numerics-") as tmp:
        files = {k: Path(tmp) / k.replace("=", "_") / "w.safetensors" for k in SETTINGS}
        for r in range(repeats):
            for name in SETTINGS if r % 2 == 0 else reversed(SETTINGS):  # interleaved, alternating order
                files[name].parent.mkdir(exist_ok=True)
                res = run_one(name, steps, files[name])
                times[name].append(round(res["seconds"], 2))
                loads.append(res["load_before"])
                rec[name] = res["numerics"]
                print(f"[numerics] round {r + 1}/{repeats} {name}: {res['seconds']:.1f} s (load {res['load_before']})", flush=True)
        weights = compare(files, "pinned")
    return {"steps": steps, "repeats": repeats, "threads": 1, "times_s": times, "load_avg_1min": loads, "weights": weights, "numerics": rec}


def report(res: dict) -> list[str]:
    med = {k: statistics.median(v) for k, v in res["times_s"].items()}
    lines = [
        f"# CPU numerics: the tiny model's warm start, {res['steps']} steps, 1 thread, {res['repeats']} interleaved rounds",
        "",
        f"CPU: {res['numerics']['pinned']['cpu']}; torch {res['numerics']['pinned']['torch']}; "
        f"load average (1 min) before each run: {min(res['load_avg_1min'])}-{max(res['load_avg_1min'])} (shared 2-core machine)",
        "",
        "| setting | torch kernels | weights hash | max abs diff vs pinned (worst tensor) | seconds (median) | vs native |",
        "|---|---|---|---|---|---|",
    ]
    for name, w in res["weights"].items():
        cap = res["numerics"][name]["torch_cpu_capability"]
        cost = f"{med[name] / med['native'] - 1:+.0%}"
        lines.append(
            f"| {name} | {cap} | {w['hash']} | {w['max_abs_diff_vs_pinned']:.3g} ({w['worst_tensor']}) | {med[name]:.1f} | {cost} |"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "results" / "cpu" / "numerics"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.steps, args.out)
    res = measure(args.steps, args.repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "numerics.json").write_text(json.dumps(res, indent=2) + "\n")
    lines = report(res)
    (out / "numerics.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
