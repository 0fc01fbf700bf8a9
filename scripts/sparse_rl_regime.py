"""Sparse-RL in the release's regime on CPU: the prompt kept whole, only the decoded reasoning compressed.

    python scripts/sparse_rl_regime.py sweep                    # before training: the sampler at each window W (seconds)
    python scripts/sparse_rl_regime.py run [--seeds 1 2 3]      # dense, uncorrected and Sparse-RL, one run at a time
    python scripts/sparse_rl_regime.py final                    # final policies under their own and the dense engine
    python scripts/sparse_rl_regime.py report                   # dose_response.csv, summary.csv, curves, under --out
    python scripts/sparse_rl_regime.py dose                     # dose_response.csv from the committed presweep + summary

``sweep`` samples the warm-started toy_long model (the long experiment's, before any training) on the test prompts
at T = 1 with the dense HF engine and with the compressed sampler at each setting of ``SETTINGS`` (the prompt kept,
a recency window of W decoded tokens; and today's prompt-cutting budgets), and writes per setting: the sampler's
accuracy and its ratio to dense, the mismatch KL (mean over sampled tokens of log pi_sparse - log pi_dense, the
dense log-probs from one full forward of the same text) and the peak-KV saving per sequence. ``run``, ``final`` and
``report`` are those of ``scripts/sparse_rl_long.py`` for the arms in ``ARMS`` (experiment files
``sparse_rl_regime_*_cpu``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing pods

from pods.errors import ConfigError  # noqa: E402

OUT = ROOT / "results" / "cpu" / "sparse_rl" / "regime"
RUNS = ROOT / "runs" / "sparse_rl_regime"
ARMS = {"dense": "sparse_rl_long_dense_cpu", "sparse": "sparse_rl_regime_uncorrected_cpu", "sparse_rl": "sparse_rl_regime_cpu"}
WINDOWS = {  # --window W: the arms trained at another window (their own folders); the dense arm is W = 20's, reused
    16: {"dense": "sparse_rl_long_dense_cpu", "sparse": "sparse_rl_regime_w16_uncorrected_cpu", "sparse_rl": "sparse_rl_regime_w16_cpu"},
}
_KEEP = {"method": "sink_window", "sink": 0, "interval": 1, "keep_prompt": True, "pad": True}
SETTINGS = {f"keep_prompt W={w}": {**_KEEP, "budget": w} for w in (4, 8, 12, 16, 20, 24, 32)} | {
    "cut prompt: sink_window 28/2 (long runs)": {"method": "sink_window", "budget": 28, "interval": 2, "sink": 4, "pad": True},
    "cut prompt: sink_window 24/2": {"method": "sink_window", "budget": 24, "interval": 2, "sink": 4, "pad": True},
}
SWEEP = [
    "setting",
    "W_or_budget",
    "keep_prompt",
    "accuracy",
    "dense_accuracy",
    "sampler_acc_ratio",
    "mismatch_kl",
    "kv_peak",
    "kv_peak_dense",
    "kv_saving",
    "kv_saving_token_steps",
    "compressed_frac",
    "n",
]


def _long():
    spec = importlib.util.spec_from_file_location("sparse_rl_long", ROOT / "scripts" / "sparse_rl_long.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dense_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    """log softmax(logits)[token] [C] of each completion token from one full forward of prompt + completion."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits[0, len(prompt) - 1 :].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


def sweep(out: Path, repeats: int) -> list[dict]:
    """The compressed sampler against the dense one on the warm-started model (see the module's doc)."""
    import torch

    from pods.compose import compose
    from pods.engines import ENGINES
    from pods.eval.accuracy import evaluate
    from pods.models import load_policy, load_tokenizer, resolve_model_dir
    from pods.results.report import write_csv
    from pods.schema import HfRollout, SparseHfRollout, complete
    from pods.tasks import DATASETS, encode_prompts

    torch.set_num_threads(1)
    cfg = compose(["experiment=sparse_rl_long_cpu"])
    model_dir = resolve_model_dir(cfg.model)
    tok, model = load_tokenizer(model_dir), None
    from pods.schema import Hardware

    model = load_policy(model_dir, Hardware(name="cpu", dtype="float32")).eval()
    ds, ev = cfg.dataset, cfg.eval.model_copy(update={"repeats": repeats})
    ids, kept, _ = encode_prompts(DATASETS.get(ds.name)(ds).test[: ev.max_examples], tok, ds.max_prompt_length)
    golds = [e.gold for e in kept]
    per_token = (
        2
        * model.config.num_hidden_layers
        * model.config.num_key_value_heads
        * (model.config.hidden_size // model.config.num_attention_heads)
        * 4
    )

    def sample(engine):
        seen = []
        res = evaluate(engine, ids, golds, ev, ds, seed=ev.seed + 10_000, on_samples=lambda r, g, s: seen.append(r))
        return res, seen[0]

    dense, _ = sample(ENGINES.get("hf")(model_dir, tok, complete(HfRollout, name="hf"), policy=model))
    rows = []
    for name, kw in SETTINGS.items():
        res, ro = sample(ENGINES.get("sparse_hf")(model_dir, tok, complete(SparseHfRollout, name="sparse_hf", **kw), policy=model))
        gaps, peaks, full = [], [], []
        plens = [len(ro.prompt_ids[i // ro.n]) for i in range(len(ro.completion_ids))]
        for i, (comp, lps) in enumerate(zip(ro.completion_ids, ro.logprobs)):
            prompt = ro.prompt_ids[i // ro.n]
            gaps += [a - b for a, b in zip(lps, dense_logprobs(model, prompt, comp))]
            budget = kw["budget"] + (len(prompt) if kw.get("keep_prompt") else 0)
            peaks.append(max(_long().cache_sizes(len(prompt), len(comp), budget, kw["interval"])))
            full.append(len(prompt) + len(comp) - 1)
        clens = list(map(len, ro.completion_ids))
        agg = _long().kv_stats(plens, clens, kw["budget"], kw["interval"], 1, bool(kw.get("keep_prompt")))
        agg_dense = _long().kv_stats(plens, clens, None, 1, 1)
        row = {"setting": name, "W_or_budget": kw["budget"], "keep_prompt": bool(kw.get("keep_prompt")), "n": res["n_eval"]}
        row |= {"accuracy": res["accuracy"], "dense_accuracy": dense["accuracy"], "sampler_acc_ratio": res["accuracy"] / dense["accuracy"]}
        row |= {
            "mismatch_kl": statistics.fmean(gaps),
            "kv_peak": per_token * statistics.fmean(peaks),
            "kv_peak_dense": per_token * statistics.fmean(full),
        }
        row["kv_saving"] = 1 - row["kv_peak"] / row["kv_peak_dense"]
        row |= {"kv_saving_token_steps": 1 - agg["kv_steps"] / agg_dense["kv_steps"], "compressed_frac": agg["compressed_frac"]}
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "presweep.csv", SWEEP)
    return rows


DOSE = [
    "setting",
    "W_or_budget",
    "keep_prompt",
    "kv_saving",
    "kv_saving_token_steps",
    "compressed_frac",
    "mismatch_kl",
    "sampler_acc_ratio",
    "trained_kv_saving",
    "trained_kv_saving_token_steps",
    "trained_compressed_frac",
    "trained_mismatch_kl",
]
DOSE += ["dense_final", "sparse_rl_ratio", "sparse_rl_own_engine_ratio", "uncorrected_ratio", "seeds", "dense_source", "note"]
SEVERE = "cut prompt: sink_window 28/2 (long runs)"


def _arm_means(rows: list[dict]) -> dict:
    """Per arm: mean final accuracy under the dense engine and under its own, peak-KV saving, mismatch KL, seeds."""
    out = {}
    for arm in ("dense", "sparse", "sparse_rl"):
        rs = [r for r in rows if r["arm"] == arm]
        if rs:
            m = {k: statistics.fmean(float(r[k]) for r in rs) for k in ("acc_final_dense_engine", "acc_final", "kv_saving_peak")}
            m |= {k: _mean_or_none(rs, k) for k in ("kv_saving_token_steps", "compressed_frac")}
            kls = [float(r["mismatch_kl"]) for r in rs if r.get("mismatch_kl") not in (None, "")]
            out[arm] = m | {"mismatch_kl": statistics.fmean(kls) if kls else None, "seeds": len(rs)}
    return out


def _mean_or_none(rows: list[dict], key: str) -> float | None:
    """The mean of ``key`` over rows that have it (runs written before a column existed leave it blank)."""
    xs = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.fmean(xs) if xs else None


def dose_response(out: Path, rows: list[dict]) -> list[dict]:
    """presweep.csv's rows joined with the trained arms: the regime runs at their W, the long runs (the severe end)."""
    import csv

    from pods.results.report import write_csv

    sweep_rows = list(csv.DictReader((out / "presweep.csv").open()))
    long_rows = list(csv.DictReader((OUT.parent / "long" / "summary.csv").open()))
    trained = {"keep_prompt W=20": (_arm_means(rows), "regime"), SEVERE: (_arm_means(long_rows), "long")}
    for w in WINDOWS:  # the other trained windows (their own folder; the dense arm is W = 20's, reused)
        if (out / f"w{w}" / "summary.csv").exists():
            trained[f"keep_prompt W={w}"] = (_arm_means(list(csv.DictReader((out / f"w{w}" / "summary.csv").open()))), f"regime w{w}")
    regime = trained["keep_prompt W=20"][0]
    if regime.get("dense", {}).get("seeds", 0) < regime.get("sparse_rl", {}).get("seeds", 0):  # the pre-registered fallback
        trained["keep_prompt W=20"][0]["dense"] = _arm_means(long_rows)["dense"]
        trained["keep_prompt W=20"] = (trained["keep_prompt W=20"][0], "long (same experiment file and seeds)")
    dose = []
    for r in sweep_rows:
        keys = ("setting", "W_or_budget", "keep_prompt", "kv_saving", "kv_saving_token_steps", "compressed_frac", "mismatch_kl")
        row = {k: r.get(k) for k in keys + ("sampler_acc_ratio",)}
        arms, source = trained.get(r["setting"], ({}, ""))
        if "dense" in arms and "sparse_rl" in arms:
            d, srl = arms["dense"]["acc_final_dense_engine"], arms["sparse_rl"]
            row |= {
                "dense_final": d,
                "sparse_rl_ratio": srl["acc_final_dense_engine"] / d,
                "sparse_rl_own_engine_ratio": srl["acc_final"] / d,
            }
            row |= {"trained_kv_saving": srl["kv_saving_peak"], "trained_mismatch_kl": srl["mismatch_kl"], "dense_source": source}
            row |= {"trained_kv_saving_token_steps": srl["kv_saving_token_steps"], "trained_compressed_frac": srl["compressed_frac"]}
            row["uncorrected_ratio"] = arms["sparse"]["acc_final_dense_engine"] / d if "sparse" in arms else None
            row["seeds"] = "/".join(str(arms[a]["seeds"]) for a in ("dense", "sparse", "sparse_rl") if a in arms)
        row["note"] = (
            "the severe end (results/cpu/sparse_rl/long)"
            if r["setting"] == SEVERE
            else (
                "trained (this folder)" if source == "regime" or "W=20" in r["setting"] else (f"trained ({source[7:]}/)" if source else "")
            )
        )
        dose.append(row)
    write_csv(dose, out / "dose_response.csv", DOSE)
    _plot_dose(dose, out / "dose_response.png")
    return dose


def _plot_dose(dose: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.4))
    for keep, marker, label in ((True, "o-", "sampler, prompt kept (window W)"), (False, "s", "sampler, prompt cut (budget)")):
        pts = sorted(
            (float(r["kv_saving"]), float(r["sampler_acc_ratio"]), r["W_or_budget"]) for r in dose if (r["keep_prompt"] == "True") == keep
        )
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color="C0" if keep else "C7", label=label)
        for x, y, w in pts:
            ax.annotate(f"{'W' if keep else 'b'}={w}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for key, color, label in (("sparse_rl_ratio", "C2", "Sparse-RL, trained"), ("uncorrected_ratio", "C3", "uncorrected, trained")):
        pts = [(float(r["trained_kv_saving"]), float(r[key])) for r in dose if r.get(key) not in (None, "")]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "D", color=color, ms=7, label=f"{label} (final policy, dense engine)")
    ax.axhline(0.9, color="k", lw=0.6, ls="--")
    ax.axvline(0.35, color="k", lw=0.6, ls=":")
    ax.set(xlabel="peak KV saving per sequence", ylabel="accuracy / dense (T = 1)", title="toy_long, tiny Qwen2: accuracy vs KV saving")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reuse_dense(runs: Path, seeds: list[int]) -> None:
    """The dense arm of another window's runs: W = 20's committed metrics and final evaluation, as run folders."""
    import shutil

    for s in seeds:
        d = runs / f"dense_s{s}"
        d.mkdir(parents=True, exist_ok=True)
        for src, name in ((OUT / f"dense_s{s}.metrics.jsonl", "metrics.jsonl"), (OUT / f"dense_s{s}.final_eval.json", "final_eval.json")):
            shutil.copyfile(src, d / name)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["sweep", "run", "final", "report", "dose"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--repeats", type=int, default=8, help="sweep: samples per test prompt")
    p.add_argument("--runs", type=Path, default=RUNS)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--window", type=int, choices=[20, *WINDOWS], default=20, help="the trained window W (20: the registered runs)")
    p.add_argument("--jobs", type=int, default=1, help="run: runs side by side (1 thread each)")
    args = p.parse_args(argv)
    if args.window != 20:  # its own runs and results, beside W = 20's; the dense arm's runs are copied in by reuse_dense
        args.runs = args.runs if args.runs != RUNS else RUNS.with_name(f"{RUNS.name}_w{args.window}")
        args.out = args.out if args.out != OUT else OUT / f"w{args.window}"
    long = _long()
    long.ARMS, long.RUNS, long.OUT = (WINDOWS[args.window] if args.window != 20 else ARMS), args.runs, args.out
    try:
        long.writable(args.out, "--out", directory=True)
    except ConfigError as e:
        long.fail(str(e))
    if args.what == "sweep":
        sweep(args.out, args.repeats)
    elif args.what == "run":  # the sparse arms seed by seed, then the dense arm (the long comparison's, rerun)
        order = [(a, s) for s in args.seeds for a in ("sparse_rl", "sparse")]
        if args.window == 20:
            order += [("dense", s) for s in args.seeds]
        else:
            reuse_dense(args.runs, args.seeds)
        long.run_jobs([long._job(a, s, args.runs) for a, s in order], args.jobs, args.out / "load.txt")
    elif args.what == "dose":  # no runs needed: the trained arms from --out/summary.csv
        import csv

        dose_response(args.out, list(csv.DictReader((args.out / "summary.csv").open())))
    elif args.what == "report" and args.window != 20:  # its own folder's files, then W = 20's dose-response with this row
        import csv

        long.report(args.out, args.runs)
        dose_response(OUT, list(csv.DictReader((OUT / "summary.csv").open())))
    elif args.what == "report":
        for row in dose_response(args.out, long.report(args.out, args.runs)):
            print({k: v for k, v in row.items() if v not in (None, "")})
    else:
        long.main([args.what, "--seeds", *map(str, args.seeds), "--jobs", "1", "--runs", str(args.runs), "--out", str(args.out)])


if __name__ == "__main__":
    main()
