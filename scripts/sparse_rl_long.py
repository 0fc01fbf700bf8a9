"""The CPU Sparse-RL comparison on toy_long: dense GRPO vs compressed-KV rollouts without / with the correction.

    python scripts/sparse_rl_long.py run [--seeds 1 2 3] [--jobs 2]   # the 9 training runs, 2 at a time (nice 5)
    python scripts/sparse_rl_long.py final                            # final policies under their own and a dense engine
    python scripts/sparse_rl_long.py report                           # CSVs, metrics copies and the plot

``run`` launches ``python -m pods.train experiment=ARM seed=S`` for the three arms (``ARMS``) into
``runs/sparse_rl_long/<arm>_s<seed>`` with one torch thread each, skips runs already finished (idempotent
reruns) and appends an ``uptime`` line to ``load.txt`` every 30 s. The experiments fix optimizer steps, not
seconds: the machine is shared, so a time budget would measure its load.

``final`` loads each run's final weights and samples the test prompts (the run's eval settings) under the run's
own engine and under the dense engine (``rollout=hf``): accuracy, and per sequence the KV tokens held at the peak
and on average over the forward passes. The sparse engine's cache sizes are replayed from the prompt and
completion lengths (``cache_sizes``, the engine's schedule; a test checks it against the engine's own peak).

``report`` writes ``summary.csv`` (one row per run), ``accuracy_vs_step.csv`` (every evaluation),
``<arm>_s<seed>.metrics.jsonl`` / ``.final_eval.json`` and ``accuracy_vs_step.png`` (mean +- sd over seeds; KV bytes per arm),
each file whole or not at all; without a finished run (``final_eval.json``) it refuses in one line (exit 2) and
writes nothing. ``--runs`` reads runs from another folder, ``--out`` writes elsewhere.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing pods

from pods.errors import ConfigError  # noqa: E402
from pods.files import atomic, writable  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"dense": "sparse_rl_long_dense_cpu", "sparse": "sparse_rl_long_uncorrected_cpu", "sparse_rl": "sparse_rl_long_cpu"}
NAMES = {"dense": "dense GRPO", "sparse": "sparse, uncorrected", "sparse_rl": "Sparse-RL"}
RUNS = ROOT / "runs" / "sparse_rl_long"
OUT = ROOT / "results" / "cpu" / "sparse_rl" / "long"


# ---- the KV held by one sequence --------------------------------------------------------------------------
def cache_sizes(prompt: int, completion: int, budget: int | None = None, interval: int = 1) -> list[int]:
    """KV entries per layer after each forward pass of one sequence: the prefill, then one per fed token (the
    last sampled token is never fed). ``budget`` None = a full cache; else the sparse engine's schedule: before a
    token would make the cache exceed ``budget``, it is cut to ``budget - interval``."""
    sizes, n = [prompt], prompt
    for _ in range(completion - 1):
        if budget is not None and n + 1 > budget:
            n = budget - interval
        n += 1
        sizes.append(n)
    return sizes


def kv_stats(
    prompts: list[int], completions: list[int], budget: int | None, interval: int, per_token: int, keep_prompt: bool = False
) -> dict:
    """Mean over sequences of the peak and of the mean KV bytes per sequence (all layers, keys + values), the KV
    byte-steps summed over every sequence and decoded token (the engine's ``kv_token_steps_*`` x bytes per token) and
    the share of sequences cut at least once; ``keep_prompt``: the budget counts decoded tokens only."""
    budgets = [None if budget is None else budget + p * keep_prompt for p in prompts]
    sizes = [cache_sizes(p, c, b, interval) for p, c, b in zip(prompts, completions, budgets)]
    cut = [b is not None and c >= 2 and p + c - 1 > b for p, c, b in zip(prompts, completions, budgets)]
    return {
        "kv_peak": per_token * statistics.fmean(max(s) for s in sizes),
        "kv_mean": per_token * statistics.fmean(statistics.fmean(s) for s in sizes),
        "kv_steps": per_token * sum(sum(s) for s in sizes),
        "compressed_frac": statistics.fmean(cut),
    }


# ---- run: the training runs ---------------------------------------------------------------------------------
def _job(arm: str, seed: int, runs: Path = RUNS) -> tuple[list[str], Path]:
    run_dir = runs / f"{arm}_s{seed}"
    cmd = ["nice", "-n", "5", sys.executable, "-m", "pods.train", f"experiment={ARMS[arm]}", f"seed={seed}"]
    return cmd + ["train.save_final=true", f"hydra.run.dir={run_dir}"], run_dir


def run(seeds: list[int], jobs: int, load: Path, runs: Path = RUNS) -> None:
    run_jobs([_job(arm, s, runs) for s in seeds for arm in ARMS], jobs, load)


def run_jobs(todo: list[tuple[list[str], Path]], jobs: int, load: Path) -> None:
    """Run ``(command, run_dir)`` jobs ``jobs`` at a time, in order, one torch thread each, skipping runs whose final
    weights exist; appends an ``uptime`` line to ``load`` every 30 s (also used by scripts/sparse_rl_toy.py)."""
    todo = [(cmd, d) for cmd, d in todo if not (d / "final" / "config.json").exists()]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    live: list[tuple[subprocess.Popen, Path]] = []
    load.parent.mkdir(parents=True, exist_ok=True)
    last = 0.0
    while todo or live:
        live = [(p, d) for p, d in live if p.poll() is None]
        while todo and len(live) < jobs:
            cmd, d = todo.pop(0)
            d.mkdir(parents=True, exist_ok=True)
            print(" ".join(cmd[3:]), flush=True)
            with (d / "stdout.log").open("w") as log:  # the child keeps its own copy of the descriptor
                live.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), d))
        if time.time() - last >= 30:
            last = time.time()
            up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
            with load.open("a") as f:
                f.write(f"{up}  | running: {' '.join(d.name for _, d in live)}\n")
        time.sleep(2)


# ---- final: the final policies under their own and a dense engine ------------------------------------------
def final(run_dir: Path) -> dict:
    """The final policy of one run on its eval prompts: accuracy and KV per sequence under its own engine and
    under the dense engine; written to ``run_dir/final_eval.json``."""
    import torch

    from pods.engines import ENGINES
    from pods.eval.accuracy import evaluate
    from pods.models import load_policy, load_tokenizer
    from pods.schema import Hardware, HfRollout, check
    from pods.tasks import DATASETS, encode_prompts

    torch.set_num_threads(1)
    plain = json.loads((run_dir / "config.json").read_text())
    cfg = check({k: v for k, v in plain.items() if k != "provenance"})  # the run's config, validated
    from pods.metrics import read_metrics

    base = next(r["model_dir"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "setup")
    model_dir = str(run_dir / "final")  # the trained weights; final/ holds no tokenizer: the base model's
    tok = load_tokenizer(base)
    policy = load_policy(model_dir, Hardware(name="cpu", dtype="float32")).eval()
    ds, ev, ro = cfg.dataset, cfg.eval, cfg.rollout
    task = DATASETS.get(ds.name)(ds)
    ids, kept, _ = encode_prompts(task.test[: ev.max_examples], tok, ds.max_prompt_length)
    golds = [e.gold for e in kept]
    hf = policy.config
    per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * (hf.hidden_size // hf.num_attention_heads) * 4
    sparse = ro.name == "sparse_hf"
    engines = {"own": ENGINES.get(ro.name)(model_dir, tok, ro, policy=policy)}
    if sparse:
        engines["dense"] = ENGINES.get("hf")(model_dir, tok, HfRollout(name="hf"), policy=policy)
    out = {}
    for name, engine in engines.items():
        seen = []
        res = evaluate(engine, ids, golds, ev, ds, seed=ev.seed + 10_000, on_samples=lambda r, g, s, seen=seen: seen.append(r))
        r = seen[0]
        prompts = [len(r.prompt_ids[i // r.n]) for i in range(len(r.completion_ids))]
        lens = [len(c) for c in r.completion_ids]
        budget = ro.budget if sparse and name == "own" else None
        out[name] = {"accuracy": res["accuracy"], "n_eval": res["n_eval"], "mean_length": res["mean_length"]}
        out[name].update(kv_stats(prompts, lens, budget, getattr(ro, "interval", 1), per_token, bool(getattr(ro, "keep_prompt", False))))
        out[name].update({f"dense_{k}": v for k, v in kv_stats(prompts, lens, None, 1, per_token).items()})
        if name == "own" and sparse:
            out[name]["engine_kv_peak"] = r.metrics["kv_bytes_sparse"]  # the engine's own count, for a check
    (run_dir / "final_eval.json").write_text(json.dumps(out, indent=1))
    return out


# ---- report -------------------------------------------------------------------------------------------------
SUMMARY = [
    "arm", "seed", "steps", "train_time_s", "acc_start", "acc_final", "acc_best", "acc_final_dense_engine",
    "kv_peak_bytes", "kv_mean_bytes", "kv_peak_bytes_dense_cache", "kv_mean_bytes_dense_cache", "kv_saving_peak", "kv_saving_mean",
    "kv_saving_token_steps", "compressed_frac", "train_kv_saving_token_steps", "train_compressed_frac", "train_kv_peak_bytes", "train_kv_peak_bytes_dense_cache", "rejected_frac", "masked_frac", "weight_max", "mismatch_kl",
]  # fmt: skip


def _runs(runs: Path = RUNS) -> list[tuple[str, int, Path]]:
    found = []
    for arm in ARMS:
        for d in sorted(runs.glob(f"{arm}_s*")):
            if d.name.removeprefix(f"{arm}_s").isdigit() and (d / "final_eval.json").exists():
                found.append((arm, int(d.name.removeprefix(f"{arm}_s")), d))
    return found


def run_row(arm: str, seed: int, d: Path) -> dict:
    from pods.metrics import read_metrics

    rows = read_metrics(d / "metrics.jsonl")
    evals, train = [r for r in rows if r.get("kind") == "eval"], [r for r in rows if r.get("kind") == "train"]
    fin = json.loads((d / "final_eval.json").read_text())
    own = fin["own"]

    def mean(k: str):
        xs = [r[k] for r in train if r.get(k) is not None]
        return statistics.fmean(xs) if xs else None

    return {
        "arm": arm,
        "seed": seed,
        "steps": train[-1]["step"],
        "train_time_s": round(train[-1]["train_time"], 1),
        "acc_start": evals[0]["accuracy"],
        "acc_final": evals[-1]["accuracy"],
        "acc_best": max(e["accuracy"] for e in evals),
        "acc_final_dense_engine": fin.get("dense", own)["accuracy"],
        "kv_peak_bytes": own["kv_peak"],
        "kv_mean_bytes": own["kv_mean"],
        "kv_peak_bytes_dense_cache": own["dense_kv_peak"],
        "kv_mean_bytes_dense_cache": own["dense_kv_mean"],
        "kv_saving_peak": 1 - own["kv_peak"] / own["dense_kv_peak"],
        "kv_saving_mean": 1 - own["kv_mean"] / own["dense_kv_mean"],
        "kv_saving_token_steps": 1 - own["kv_steps"] / own["dense_kv_steps"] if "kv_steps" in own else None,  # runs before it: blank
        "compressed_frac": own.get("compressed_frac"),
        "train_kv_saving_token_steps": mean("kv_saving_token_steps"),
        "train_compressed_frac": mean("kv_compressed_frac"),
        "train_kv_peak_bytes": mean("kv_bytes_sparse"),
        "train_kv_peak_bytes_dense_cache": mean("kv_bytes_dense"),
        "rejected_frac": mean("sparse_rl_rejected_frac"),
        "masked_frac": mean("sparse_rl_masked_frac"),
        "weight_max": max((r["sparse_rl_weight_max"] for r in train if "sparse_rl_weight_max" in r), default=None),
        "mismatch_kl": mean("mismatch_kl"),
    }


def _msd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def plot(curves: dict[str, dict[int, list[float]]], rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw={"width_ratios": [1.6, 1]})
    for i, (arm, by_step) in enumerate(curves.items()):
        steps = sorted(by_step)
        m = np.array([statistics.fmean(by_step[s]) for s in steps])
        sd = np.array([statistics.stdev(by_step[s]) if len(by_step[s]) > 1 else 0.0 for s in steps])
        n = min(len(v) for v in by_step.values())
        ax.plot(steps, m, color=f"C{i}", marker="o", ms=3, label=f"{NAMES[arm]} ({n} seeds, own engine)")
        ax.fill_between(steps, m - sd, m + sd, color=f"C{i}", alpha=0.2, lw=0)
        dense_final = [r["acc_final_dense_engine"] for r in rows if r["arm"] == arm]
        if arm != "dense":
            mu, s = _msd(dense_final)
            ax.errorbar(
                [steps[-1] + 4 + 3 * i],
                [mu],
                yerr=[s],
                color=f"C{i}",
                marker="D",
                ms=5,
                capsize=3,
                label=f"{NAMES[arm]}: final policy, dense engine",
            )
    ax.set(xlabel="optimizer step", ylabel="test accuracy (mean +- sd over seeds)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    arms = list(curves)
    x = np.arange(len(arms))
    for j, (key, label) in enumerate((("kv_peak_bytes", "peak"), ("kv_mean_bytes", "mean over the sequence"))):
        vals = [_msd([r[key] / 1024 for r in rows if r["arm"] == a]) for a in arms]
        bx.bar(x + (j - 0.5) * 0.38, [v[0] for v in vals], 0.38, yerr=[v[1] for v in vals], capsize=3, label=label, alpha=0.85)
    bx.set_xticks(x, [NAMES[a] for a in arms], fontsize=9)
    bx.set(ylabel="KV cache per sequence (KiB, final policy, test prompts)", title="KV bytes per sequence")
    bx.grid(alpha=0.3, axis="y")
    bx.legend(fontsize=8)
    fig.tight_layout()
    with atomic(path, "wb") as f:
        fig.savefig(f, dpi=120, format=path.suffix[1:])
    plt.close(fig)


def copy(src: Path, dst: Path) -> None:
    """``src`` to ``dst``, whole or not at all."""
    with atomic(dst, "wb") as f, src.open("rb") as g:
        shutil.copyfileobj(g, f)


def fail(msg: str) -> None:
    print(f"{Path(__file__).name}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def report(out: Path, runs: Path = RUNS) -> list[dict]:
    """The files under ``out`` (see the module's doc), every one computed before the first is written."""
    from pods.metrics import read_metrics
    from pods.results.report import write_csv

    found = _runs(runs)
    if not found:
        fail(f"no finished run under {runs} (a <arm>_s<seed> folder with final_eval.json: `run`, then `final`); {out} left as it was")
    out.mkdir(parents=True, exist_ok=True)
    rows, curve_rows, curves = [], [], {}
    for arm, seed, d in found:
        rows.append(run_row(arm, seed, d))
        for e in (r for r in read_metrics(d / "metrics.jsonl") if r.get("kind") == "eval"):
            curve_rows.append(
                {"arm": arm, "seed": seed, "step": e["step"], "train_time": round(e["train_time"], 2), "accuracy": e["accuracy"]}
            )
            curves.setdefault(arm, {}).setdefault(e["step"], []).append(e["accuracy"])
    for arm, seed, d in found:
        copy(d / "metrics.jsonl", out / f"{arm}_s{seed}.metrics.jsonl")
        copy(d / "final_eval.json", out / f"{arm}_s{seed}.final_eval.json")
    write_csv(rows, out / "summary.csv", SUMMARY)
    write_csv(curve_rows, out / "accuracy_vs_step.csv", ["arm", "seed", "step", "train_time", "accuracy"])
    plot(curves, rows, out / "accuracy_vs_step.png", "toy_long, tiny Qwen2, CPU: dense vs compressed-KV rollouts")
    for arm in ARMS:
        rs = [r for r in rows if r["arm"] == arm]
        if rs:
            stats = {k: "{:.3f} +- {:.3f}".format(*_msd([r[k] for r in rs])) for k in ("acc_start", "acc_final", "acc_final_dense_engine")}
            kv = {k: "{:.0f} +- {:.0f}".format(*_msd([r[k] for r in rs])) for k in ("kv_peak_bytes", "kv_mean_bytes")}
            print(
                arm,
                len(rs),
                stats,
                kv,
                "saving peak/mean %.3f/%.3f" % (_msd([r["kv_saving_peak"] for r in rs])[0], _msd([r["kv_saving_mean"] for r in rs])[0]),
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["run", "final", "report"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--runs", type=Path, default=RUNS, help="the run directories' folder (default runs/sparse_rl_long)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.what != "final":  # run appends load.txt there, report writes its files
        try:
            writable(args.out, "--out", directory=True)
        except ConfigError as e:
            fail(str(e))
    if args.what == "run":
        run(args.seeds, args.jobs, args.out / "load.txt", args.runs)
    elif args.what == "final":
        for d in [_job(a, s, args.runs)[1] for s in args.seeds for a in ARMS]:
            if (d / "final" / "config.json").exists() and not (d / "final_eval.json").exists():
                print(d.name, json.dumps(final(d)), flush=True)
    else:
        report(args.out, args.runs)


if __name__ == "__main__":
    main()
