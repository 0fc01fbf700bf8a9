"""Does the pin matter for a whole run? ``make demo``'s GRPO 16/16 arm (400 steps, 8 evaluations of 200 prompts x 4)
under kernel settings, each a real ``python -m pods.train experiment=demo_grpo_cpu`` in its own process:

- ``pinned``: the package's pin (``pods.numerics``: ATen AVX2, MKL_CBWR=AVX2, oneDNN at most AVX2);
- ``aten=avx2`` / ``aten=avx512``: no pin (``PODS_NUMERICS=native``), only ATEN_CPU_CAPABILITY set.

Compares every evaluation's accuracy, every step's reward and grad norm, and the final weights with the pinned run's,
and the pinned run's accuracies with the committed ``results/demo`` (made on another machine). Steps are the budget,
so the load of the shared machine changes seconds only. Run (about 10 min here, two runs at a time):
``python benchmarks/bench_numerics_run.py`` -> ``results/cpu/numerics/run.json`` and ``run.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script without installing the package
from pods.numerics import PINNED  # noqa: E402

SETTINGS = {
    "pinned": {},
    "aten=avx2": {"PODS_NUMERICS": "native", "ATEN_CPU_CAPABILITY": "avx2"},
    "aten=avx512": {"PODS_NUMERICS": "native", "ATEN_CPU_CAPABILITY": "avx512"},
}
NUMERIC_VARS = ("PODS_NUMERICS", "DNNL_MAX_CPU_ISA", *PINNED)  # dropped from the environment before each setting
ARM, LABEL = "demo_grpo_cpu", "GRPO 16/16"


def run_one(name: str, out: Path) -> dict:
    """One training run under setting ``name`` into ``out``; its eval accuracies, train rows and seconds."""
    env = {k: v for k, v in os.environ.items() if k not in NUMERIC_VARS}
    env.update(SETTINGS[name], PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pods.train", f"experiment={ARM}", "train.save_final=true", "logger.name=none", f"hydra.run.dir={out}"]
    t0, load = time.time(), os.getloadavg()[0]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name}: pods.train failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    cfg = json.loads((out / "config.json").read_text())
    return {
        "eval": {r["step"]: r["accuracy"] for r in rows if r.get("kind") == "eval"},
        "train": [(r["step"], r["reward_mean_all"], r["grad_norm"]) for r in rows if r.get("kind") == "train"],
        "isa": cfg["provenance"]["numerics"]["torch_cpu_capability"],
        "seconds": round(time.time() - t0, 1),
        "load": round(load, 2),
    }


def weight_gap(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    wa, wb = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    return max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)


def committed() -> dict[int, float]:
    path = ROOT / "results" / "demo" / "accuracy_vs_time.csv"
    with path.open() as f:
        return {int(r["step"]): float(r["accuracy"]) for r in csv.DictReader(f) if r["label"] == LABEL}


def report(res: dict, gaps: dict, demo: dict[int, float]) -> str:
    base = res["pinned"]
    lines = [
        f"# Does the pin matter for a whole run? `make demo`'s {LABEL} arm ({ARM}, 400 steps) per kernel setting",
        "",
        "| setting | torch kernels | evals equal to pinned | largest eval accuracy difference | train steps with a different reward / grad norm "
        "| final weights max abs diff vs pinned | seconds | load (1 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in res.items():
        same = sum(r["eval"].get(s) == a for s, a in base["eval"].items())
        worst = max(abs(r["eval"].get(s, -1) - a) for s, a in base["eval"].items())
        differ = sum(x != y for x, y in zip(r["train"], base["train"]))
        lines.append(
            f"| {name} | {r['isa']} | {same}/{len(base['eval'])} | {worst:.4f} | {differ}/{len(base['train'])} "
            f"| {gaps[name]:.2e} | {r['seconds']} | {r['load']} |"
        )
    same = sum(demo.get(s) == a for s, a in base["eval"].items())
    lines += [
        "",
        f"The pinned run against the committed results/demo ({LABEL}, made on another machine): {same}/{len(base['eval'])} evaluations equal.",
        "",
        "| step | " + " | ".join(res) + " | committed |",
        "|---|" + "---|" * (len(res) + 1),
    ]
    for s in sorted(base["eval"]):
        lines.append(
            f"| {s} | "
            + " | ".join(f"{r['eval'].get(s, float('nan')):.4f}" for r in res.values())
            + f" | {demo.get(s, float('nan')):.4f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "cpu" / "numerics")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (each uses the experiment's 1 torch thread)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {name: Path(tmp) / name.replace("=", "_") for name in SETTINGS}
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = {name: pool.submit(run_one, name, d) for name, d in dirs.items()}
            res = {name: f.result() for name, f in futures.items()}
        gaps = {name: weight_gap(dirs[name], dirs["pinned"]) for name in SETTINGS}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "run.json").write_text(json.dumps({"results": res, "weight_gap": gaps}, indent=1))
    text = report(res, gaps, committed())
    (args.out / "run.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
