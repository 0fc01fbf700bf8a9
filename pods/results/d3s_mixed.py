"""The mixed-difficulty D3S ablation (docs/d3s.md "Mixed difficulty"): run it, then summarise it.

``python -m pods.results.d3s_mixed reproduce [--seeds 1 2 3] [--out results/cpu/d3s_mixed]`` runs the 5 arms x seeds
ONE AT A TIME (seed-major: every arm of seed 1 first), each as ``python -m pods.train experiment=d3s_mixed_<arm>_cpu
seed=<s>`` into ``runs/d3s_mixed/<arm>_s<s>``; a run whose metrics end with its final evaluation is kept, any other is
started afresh (rerun to continue). Each finished run's config.json and metrics.jsonl are copied to
``<out>/runs/<arm>_s<s>/``; ``summarize`` reads only those copies, so the committed folder reproduces its report.

The metric (registered before the runs): a run's curve is the on-policy accuracy of each step's 64 rollouts
(``train_accuracy``, before selection), averaged over a trailing window of ``WINDOW`` steps; an arm's curve is the
mean over its seeds. "GRPO's final accuracy" is GRPO's curve at its last step.
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

import numpy as np

from pods.metrics import read_metrics

ARMS = ["grpo", "intra", "cross", "tokens", "full"]
LABEL = {
    "grpo": "GRPO 8/8",
    "intra": "samples within groups",
    "cross": "samples across groups",
    "tokens": "samples + tokens, no schedule",
    "full": "full D3S (schedule)",
}
WINDOW = 10
SUMMARY = [
    "arm", "seed", "steps", "train_time_s", "tokens_generated", "tokens_trained", "kept_per_step", "acc_test_final",
    "answer_prob_final", "acc_first", "acc_last", "zero_var", "entropy_kept", "entropy_dropped", "entropy_ratio",
]  # fmt: skip


def finished(run_dir: Path, steps: int | None = None) -> bool:
    """The run's metrics end with the evaluation after its last step (``steps``: the expected last step)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return False
    rows = read_metrics(path)
    cfg = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
    last = steps or cfg.get("train", {}).get("max_steps")
    return bool(rows) and rows[-1].get("kind") == "eval" and rows[-1].get("step") == last


def reproduce(seeds: list[int], out: Path, runs: Path, extra: list[str], arms: list[str] = ARMS, prefix: str = "d3s_mixed") -> None:
    """Every missing run of ``experiment=<prefix>_<arm>_cpu``, one at a time (``uptime`` before each into
    ``<out>/load.txt``); then this ablation's ``summarize`` (another ``prefix`` summarises its own)."""
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for arm in arms:
            run_dir, keep = runs / f"{arm}_s{seed}", out / "runs" / f"{arm}_s{seed}"
            if not (finished(keep) or finished(run_dir)):
                shutil.rmtree(run_dir, ignore_errors=True)
                run_dir.mkdir(parents=True)
                load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
                with (out / "load.txt").open("a") as f:
                    f.write(f"{time.strftime('%H:%M:%S')} start {arm}_s{seed} | {load}\n")
                cmd = [
                    sys.executable,
                    "-m",
                    "pods.train",
                    f"experiment={prefix}_{arm}_cpu",
                    f"seed={seed}",
                    f"hydra.run.dir={run_dir}",
                    *extra,
                ]
                print(" ".join(cmd[1:]), flush=True)
                with (run_dir / "stdout.log").open("w") as log:
                    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
            if not finished(keep):
                keep.mkdir(parents=True, exist_ok=True)
                for name in ("config.json", "metrics.jsonl"):
                    shutil.copy(run_dir / name, keep / name)
    if prefix == "d3s_mixed":
        summarize(out, seeds)


def window(xs: list[float], w: int = WINDOW) -> np.ndarray:
    """[S] the trailing mean of ``xs`` over the last ``w`` values (fewer at the start)."""
    c = np.cumsum(np.r_[0.0, np.asarray(xs, dtype=float)])
    i = np.arange(1, len(xs) + 1)
    return (c[i] - c[np.maximum(i - w, 0)]) / np.minimum(i, w)


def load(out: Path, seeds: list[int] | None = None, arms: list[str] = ARMS) -> dict[str, dict[int, list[dict]]]:
    """{arm: {seed: train and eval rows}} of the copied runs under ``out/runs`` (of ``seeds`` only, when given)."""
    runs: dict[str, dict[int, list[dict]]] = {}
    for d in sorted((out / "runs").glob("*_s*")):
        arm, seed = d.name.rsplit("_s", 1)
        if arm in arms and finished(d) and (seeds is None or int(seed) in seeds):
            runs.setdefault(arm, {})[int(seed)] = read_metrics(d / "metrics.jsonl")
    return {a: runs[a] for a in arms if a in runs}


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def run_row(arm: str, seed: int, rows: list[dict]) -> dict:
    """One ``SUMMARY`` row (accuracies: the first and last ``WINDOW`` steps' on-policy accuracy; test: the final eval)."""
    train = [r for r in rows if r["kind"] == "train"]
    acc = [r["train_accuracy"] for r in train]
    ek, ed = _mean(r.get("entropy_kept") for r in train), _mean(r.get("entropy_dropped") for r in train)
    return {
        "arm": arm,
        "seed": seed,
        "steps": len(train),
        "train_time_s": round(train[-1]["train_time"], 1),
        "tokens_generated": sum(r["tokens"] for r in train),
        "tokens_trained": sum(r["tokens_trained"] for r in train),
        "kept_per_step": _mean(r["kept"] for r in train),
        "acc_test_final": [r for r in rows if r["kind"] == "eval"][-1]["accuracy"],
        "answer_prob_final": [r for r in rows if r["kind"] == "eval"][-1].get("answer_prob"),
        "acc_first": statistics.fmean(acc[:WINDOW]),
        "acc_last": statistics.fmean(acc[-WINDOW:]),
        "zero_var": statistics.fmean(r["zero_var_groups"] for r in train),
        "entropy_kept": ek,
        "entropy_dropped": ed,
        "entropy_ratio": ek / ed if ek is not None and ed else None,
    }


def curves(runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    """Per arm, seed and step: cumulative tokens trained, training seconds, on-policy accuracy and its window mean."""
    out = []
    for arm, seeds in runs.items():
        for seed, rows in seeds.items():
            train = [r for r in rows if r["kind"] == "train"]
            smooth, tokens = window([r["train_accuracy"] for r in train]), np.cumsum([r["tokens_trained"] for r in train])
            for r, s, t in zip(train, smooth, tokens):
                out.append({"arm": arm, "seed": seed, "step": r["step"], "tokens_trained": int(t), "train_time_s": round(r["train_time"], 2),
                            "train_accuracy": r["train_accuracy"], "accuracy_window": round(float(s), 4)})  # fmt: skip
    return out


def mean_curve(rows: list[dict], arm: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    """The arm's seeds' window curves, averaged at each step (x: the mean over seeds of ``x`` at that step)."""
    mine = [r for r in rows if r["arm"] == arm]
    steps = sorted({r["step"] for r in mine})
    xs = [statistics.fmean(r[x] for r in mine if r["step"] == s) for s in steps]
    ys = [statistics.fmean(r["accuracy_window"] for r in mine if r["step"] == s) for s in steps]
    return np.asarray(xs, dtype=float), np.asarray(ys)


def first_reach(xs: np.ndarray, ys: np.ndarray, target: float) -> float | None:
    hit = np.nonzero(ys >= target - 1e-12)[0]
    return float(xs[hit[0]]) if hit.size else None


def _se(xs: list[float]) -> float:
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0


def predictions(table: list[dict], rows: list[dict]) -> list[dict]:
    """The registered predictions (a)-(d) with their numbers; ``held`` as registered in docs/d3s.md."""
    by = {a: [r for r in table if r["arm"] == a] for a in ARMS}
    test = {a: [r["acc_test_final"] for r in by[a]] for a in ARMS}
    out = []
    if by["grpo"]:
        zv = statistics.fmean(r["zero_var"] for r in by["grpo"])
        out.append({"prediction": "a: GRPO zero-variance fraction >= 0.25", "value": round(zv, 3), "held": zv >= 0.25})
        xs, ys = mean_curve(rows, "grpo", "step")
        target, budget = float(ys[-1]), float(xs[-1])
        for arm in ARMS[1:]:
            if by[arm]:
                s = first_reach(*mean_curve(rows, arm, "step"), target)
                t = first_reach(*mean_curve(rows, arm, "tokens_trained"), target)
                t_grpo = first_reach(*mean_curve(rows, "grpo", "tokens_trained"), target)
                held = s is not None and s <= 2 / 3 * budget
                out.append({"prediction": f"b: {arm} reaches GRPO's final {target:.3f} in <= 2/3 of its {budget:.0f} steps", "value": s,
                            "tokens": t, "tokens_grpo": t_grpo, "held": held if arm == "cross" else None})  # fmt: skip
    if test["intra"] and test["cross"]:
        d = statistics.fmean(test["cross"]) - statistics.fmean(test["intra"])
        se = (_se(test["cross"]) ** 2 + _se(test["intra"]) ** 2) ** 0.5
        out.append({"prediction": "c: final test accuracy within < across groups", "value": round(d, 4), "se": round(se, 4), "held": d > 0})
    for arm in ("tokens", "full"):
        ratios = [r["entropy_ratio"] for r in by[arm] if r["entropy_ratio"] is not None]
        if ratios:
            m = statistics.fmean(ratios)
            out.append({"prediction": f"d1: {arm} kept / dropped token entropy >= 2", "value": round(m, 3), "held": m >= 2})
    if test["full"]:
        for arm in ("intra", "cross", "tokens"):
            if test[arm]:
                d = statistics.fmean(test["full"]) - statistics.fmean(test[arm])
                se = (_se(test["full"]) ** 2 + _se(test[arm]) ** 2) ** 0.5
                out.append(
                    {"prediction": f"d2: full D3S final test accuracy > {arm}", "value": round(d, 4), "se": round(se, 4), "held": d > 0}
                )
    return out


def start_of(out: Path) -> dict | None:
    """The start's evaluation (the shipped model before any step, the runs' eval seed): ``<out>/start/metrics.jsonl``."""
    path = out / "start" / "metrics.jsonl"
    evals = [r for r in read_metrics(path) if r["kind"] == "eval"] if path.exists() else []
    return evals[0] if evals else None


def reported(table: list[dict], runs: dict[str, dict[int, list[dict]]], start: dict | None) -> list[dict]:
    """Reported beside the predictions (the follow-up's registration, docs/d3s.md): whether GRPO learned (its mean final
    test accuracy AND answer_prob above the start's: only then is (b) informative), and per arm the paired difference
    of its on-policy accuracy to GRPO's over the last ``WINDOW`` steps (one seed draws the same prompts for every arm),
    mean over the seeds both have, with the SE over seeds."""
    out = []
    grpo = [r for r in table if r["arm"] == "grpo"]
    if grpo and start is not None:
        acc, prob = statistics.fmean(r["acc_test_final"] for r in grpo), statistics.fmean(r["answer_prob_final"] for r in grpo)
        out.append({"reported": "GRPO learned: final test accuracy and answer_prob above the start (else b is uninformative)",
                    "value": [round(acc, 4), round(prob, 4)], "start": [start["accuracy"], round(start["answer_prob"], 4)],
                    "held": acc > start["accuracy"] and prob > start["answer_prob"]})  # fmt: skip

    def last(rows: list[dict]) -> list[float]:
        return [r["train_accuracy"] for r in rows if r["kind"] == "train"][-WINDOW:]

    for arm in ARMS[1:]:
        seeds = sorted(set(runs.get(arm, {})) & set(runs.get("grpo", {})))
        diffs = [statistics.fmean(np.subtract(last(runs[arm][s]), last(runs["grpo"][s]))) for s in seeds]
        if diffs:
            out.append({"reported": f"paired on-policy accuracy {arm} - grpo, last {WINDOW} steps (same prompts)",
                        "value": round(statistics.fmean(diffs), 4), "se": round(_se(diffs), 4), "seeds": seeds})  # fmt: skip
    return out


def strata_rows(runs: dict[str, dict[int, list[dict]]], n: int = 8) -> list[dict]:
    """Per arm and prompt length (toy_sum: the term count), over all steps and seeds: groups, zero-variance share,
    kept rollouts per group, on-policy accuracy in the first and last ``WINDOW`` steps (``n`` rollouts per group:
    the experiment files' ``algorithm.n``)."""
    out = []
    for arm, seeds in runs.items():
        train = [r for rows in seeds.values() for r in rows if r["kind"] == "train" and r.get("strata")]
        last = max(r["step"] for r in train)
        for length in sorted({k for r in train for k in r["strata"]}, key=int):
            cells = [(r["step"], *r["strata"][length]) for r in train if length in r["strata"]]  # step, groups, zero-var, kept, reward

            def acc(cs: list) -> float | None:
                return round(sum(c[4] for c in cs) / (n * sum(c[1] for c in cs)), 3) if cs else None

            groups = sum(c[1] for c in cells)
            out.append({"arm": arm, "prompt_tokens": int(length), "groups": groups, "zero_var": round(sum(c[2] for c in cells) / groups, 3),
                        "kept_per_group": round(sum(c[3] for c in cells) / groups, 3),
                        "acc_first": acc([c for c in cells if c[0] <= WINDOW]), "acc_last": acc([c for c in cells if c[0] > last - WINDOW])})  # fmt: skip
    return out


def plot(rows: list[dict], path: Path) -> None:
    """Window accuracy against steps and against tokens trained, one line per arm (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x, name in zip(axes, ("step", "tokens_trained"), ("optimizer step", "tokens trained")):
        for arm in ARMS:
            if any(r["arm"] == arm for r in rows):
                ax.plot(*mean_curve(rows, arm, x), label=LABEL[arm])
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"on-policy accuracy ({WINDOW}-step window)")
    axes[0].legend(fontsize=8)
    fig.suptitle("toy_sum (2-5 terms, binary reward), tiny Qwen2, CPU: the D3S ablation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(out: Path, seeds: list[int] | None = None) -> list[dict]:
    """summary.csv (arm x seed), curves.csv (by step and tokens), strata.csv, predictions.json, accuracy.png, from the
    finished runs of ``seeds`` (None: all)."""
    from pods.results.report import write_csv

    runs = load(out, seeds)
    if not runs:
        raise SystemExit(f"no finished run under {out / 'runs'}")
    table = [run_row(arm, seed, rows) for arm, seeds in runs.items() for seed, rows in sorted(seeds.items())]
    rows = curves(runs)
    write_csv(table, out / "summary.csv", SUMMARY)
    write_csv(rows, out / "curves.csv", list(rows[0]))
    st = strata_rows(runs)
    write_csv(st, out / "strata.csv", list(st[0]))
    pred = predictions(table, rows) + reported(table, runs, start_of(out))
    (out / "predictions.json").write_text(json.dumps(pred, indent=1) + "\n")
    plot(rows, out / "accuracy.png")
    for p in pred:
        print(p)
    return pred


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pods.results.d3s_mixed", description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["reproduce", "summarize"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--out", type=Path, default=Path("results/cpu/d3s_mixed"))
    ap.add_argument("--runs", type=Path, default=Path("runs/d3s_mixed"))
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=ARMS)
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE overrides for every run (tests: tiny budgets)")
    args = ap.parse_intermixed_args(argv)
    if args.what == "reproduce":
        reproduce(args.seeds, args.out, args.runs, args.overrides, args.arms)
    else:
        summarize(args.out, args.seeds)


if __name__ == "__main__":
    main()
