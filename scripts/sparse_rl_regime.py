"""Sparse-RL in the release's regime on CPU (issue 30): the prompt kept whole, only the decoded reasoning compressed.

    python scripts/sparse_rl_regime.py sweep                    # before training: the sampler at each window W (seconds)
    python scripts/sparse_rl_regime.py run [--seeds 1 2 3]      # dense, uncorrected and Sparse-RL, one run at a time
    python scripts/sparse_rl_regime.py final                    # final policies under their own and the dense engine
    python scripts/sparse_rl_regime.py report                   # dose_response.csv, summary.csv, curves, under --out

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
        for i, (comp, lps) in enumerate(zip(ro.completion_ids, ro.logprobs)):
            prompt = ro.prompt_ids[i // ro.n]
            gaps += [a - b for a, b in zip(lps, dense_logprobs(model, prompt, comp))]
            budget = kw["budget"] + (len(prompt) if kw.get("keep_prompt") else 0)
            peaks.append(max(_long().cache_sizes(len(prompt), len(comp), budget, kw["interval"])))
            full.append(len(prompt) + len(comp) - 1)
        row = {"setting": name, "W_or_budget": kw["budget"], "keep_prompt": bool(kw.get("keep_prompt")), "n": res["n_eval"]}
        row |= {"accuracy": res["accuracy"], "dense_accuracy": dense["accuracy"], "sampler_acc_ratio": res["accuracy"] / dense["accuracy"]}
        row |= {
            "mismatch_kl": statistics.fmean(gaps),
            "kv_peak": per_token * statistics.fmean(peaks),
            "kv_peak_dense": per_token * statistics.fmean(full),
        }
        row["kv_saving"] = 1 - row["kv_peak"] / row["kv_peak_dense"]
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "presweep.csv", SWEEP)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["sweep", "run", "final", "report"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--repeats", type=int, default=8, help="sweep: samples per test prompt")
    p.add_argument("--runs", type=Path, default=RUNS)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    long = _long()
    long.ARMS, long.RUNS, long.OUT = ARMS, args.runs, args.out
    try:
        long.writable(args.out, "--out", directory=True)
    except ConfigError as e:
        long.fail(str(e))
    if args.what == "sweep":
        sweep(args.out, args.repeats)
    elif args.what == "run":  # the sparse arms seed by seed, then the dense arm (the long comparison's, rerun)
        order = [(a, s) for s in args.seeds for a in ("sparse_rl", "sparse")] + [("dense", s) for s in args.seeds]
        long.run_jobs([long._job(a, s, args.runs) for a, s in order], 1, args.out / "load.txt")
    else:
        long.main([args.what, "--seeds", *map(str, args.seeds), "--jobs", "1", "--runs", str(args.runs), "--out", str(args.out)])


if __name__ == "__main__":
    main()
