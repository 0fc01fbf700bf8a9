"""Does ``train.max_staleness=1`` learn like the synchronous loop, by steps? (docs/async.md, the pre-registered check)

    python benchmarks/async_learning.py [--seeds 0,1,2] [--out results/cpu/async] [--work /tmp/pods-async]
        [--both 'rollout=vllm_server'] [--async-args 'algorithm.correction=behaviour_is'] [--sync-from results/cpu/async]

Runs ``experiment=demo_pods_cpu`` (PODS 64 -> 16 on the toy task, 130 steps, an evaluation every 16) with
``train.max_staleness`` 0 and 1 for each seed, one run at a time through ``python -m pods.train``, and copies each
run's ``metrics.jsonl`` to ``<out>/<arm>_s<seed>.jsonl``; a run whose rows are there is not run again (rerun to
continue). Then writes ``<out>/accuracy_vs_step.csv`` and ``<out>/summary.txt`` (printed): D, the final difference
against its noise band, the async arm's gain, and the staleness bound, each with held/failed. ``--both`` adds
overrides to both arms, ``--async-args`` to the async arm only (the follow-ups: results/cpu/async_bis,
results/cpu/async_server); ``--sync-from DIR`` reads the sync arm's rows from DIR (committed runs of the same seeds
and setting) instead of running it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"sync": 0, "async": 1}  # arm -> train.max_staleness


def run(arm: str, seed: int, out: Path, work: Path, extra: list[str]) -> None:
    rows = out / f"{arm}_s{seed}.jsonl"
    if rows.exists():
        return
    run_dir = work / f"{arm}_s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["experiment=demo_pods_cpu", f"seed={seed}", f"train.max_staleness={ARMS[arm]}", "train.checkpoint_at_end=false"]
    args += extra
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0, load = time.time(), os.getloadavg()[0]
    p = subprocess.run(
        [sys.executable, "-m", "pods.train", *args, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if p.returncode:
        sys.exit(f"{arm} seed {seed} failed: {p.stderr[-2000:]}")
    shutil.copy(run_dir / "metrics.jsonl", rows)
    with open(out / "runs.txt", "a") as f:
        f.write(
            f"{arm} seed {seed} {' '.join(extra)}: {time.time() - t0:.0f} s wall, load {load:.1f} at start, {os.getloadavg()[0]:.1f} at end\n"
        )


def rows_of(path: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd / math.sqrt(len(xs))


def summarize(seeds: list[int], out: Path, sync_dir: Path, load: str) -> str:
    where = {"sync": sync_dir, "async": out}
    acc = {arm: [{r["step"]: r["accuracy"] for r in rows_of(where[arm] / f"{arm}_s{s}.jsonl", "eval")} for s in seeds] for arm in ARMS}
    steps = sorted(acc["sync"][0])
    curve = {arm: {st: mean_se([a[st] for a in acc[arm]]) for st in steps} for arm in ARMS}
    lines = ["step,sync_mean,sync_se,async_mean,async_se"]
    lines += [
        f"{st},{curve['sync'][st][0]:.4f},{curve['sync'][st][1]:.4f},{curve['async'][st][0]:.4f},{curve['async'][st][1]:.4f}"
        for st in steps
    ]
    (out / "accuracy_vs_step.csv").write_text("\n".join(lines) + "\n")
    later = [st for st in steps if st > 0]
    d = sum(curve["async"][st][0] - curve["sync"][st][0] for st in later) / len(later)
    last = steps[-1]
    (ma, sa), (ms, ss) = curve["async"][last], curve["sync"][last]
    band = 1.96 * math.sqrt(sa**2 + ss**2)
    gain = ma - curve["async"][0][0]
    train = [r for s in seeds for r in rows_of(out / f"async_s{s}.jsonl", "train")]
    bound = all(r["staleness_max"] <= 1 for r in train)
    steady = all(r["staleness_max"] == 1 and r["staleness_mean"] == 1 for r in train if r["step"] > 1)
    ok = lambda c: "held" if c else "FAILED"  # noqa: E731
    text = [
        f"demo_pods_cpu, seeds {seeds}, 130 steps; test accuracy (mean over seeds) at steps {steps}",
        f"(1) D = mean over evaluations after step 0 of (async - sync) = {d:+.4f}; |D| <= 0.05: {ok(abs(d) <= 0.05)}",
        f"(2) final (step {last}): async {ma:.4f} ± {sa:.4f} SE, sync {ms:.4f} ± {ss:.4f} SE; "
        f"difference {ma - ms:+.4f}, band ±{band:.4f}: {ok(abs(ma - ms) <= band)}",
        f"(3) async gain over its step-0 accuracy: {gain:+.4f} >= 0.2: {ok(gain >= 0.2)}",
        f"(4) {len(train)} async train rows: staleness_max <= 1 on every row: {ok(bound)}; staleness 1 on every row after step 1: {ok(steady)}",
    ]
    clock = {arm: [rows_of(where[arm] / f"{arm}_s{s}.jsonl", "train")[-1]["train_time"] for s in seeds] for arm in ARMS}
    text.append(
        f"not a speed claim (other jobs loaded the machine, {load} on 2 cores; runs.txt): train_time at the last step, s: "
        + "; ".join(f"{arm} {', '.join(f'{t:.0f}' for t in clock[arm])}" for arm in ARMS)
    )
    (out / "summary.txt").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu" / "async"))
    ap.add_argument("--work", default="/tmp/pods-async")
    ap.add_argument("--both", default="", help="overrides for both arms, space-separated")
    ap.add_argument("--async-args", default="", help="overrides for the async arm only, space-separated")
    ap.add_argument("--sync-from", default="", help="read the sync rows from this directory instead of running them")
    ap.add_argument("--load", default="8-20", help="the load range to quote in the summary (from runs.txt)")
    a = ap.parse_args()
    seeds, out, work = [int(s) for s in a.seeds.split(",")], Path(a.out), Path(a.work)
    sync_dir = Path(a.sync_from) if a.sync_from else out
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for arm in ARMS:
            if arm == "async" or not a.sync_from:
                run(arm, seed, out, work, a.both.split() + (a.async_args.split() if arm == "async" else []))
    print(summarize(seeds, out, sync_dir, a.load))


if __name__ == "__main__":
    main()
