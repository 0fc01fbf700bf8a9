"""D3S's outcome where GRPO can learn (docs/d3s.md "Outcome"): probe the starting model, pilot GRPO, run the ablation.

``python -m pods.results.d3s_outcome probe [--out DIR] [KEY=VALUE ...]`` builds (once, pinned numerics, cached) the
tiny model of ``experiment=d3s_outcome_grpo_cpu`` with the overrides and measures, per term count, greedy and
T = 1 accuracy of ``--prompts`` training prompts (8 samples each, so the zero-variance share of 8-rollout groups is
counted, not inferred) and the teacher-forced probability of the canonical answer; it writes ``probe.json`` and
says whether the gate holds: greedy >= ``GREEDY_MIN`` on every stratum, the T = 1 accuracy of every stratum within
``SAMPLED``, and a zero-variance share of at least ``ZERO_VAR_MIN``.

``python -m pods.results.d3s_outcome reproduce [--seeds 1 2 3] [--arms ...]`` runs ``d3s_outcome_<arm>_cpu`` for each
arm and seed one at a time through ``python -m pods.train`` (the mixed-difficulty ablation's driver,
``pods.results.d3s_mixed``, with this ablation's experiment prefix), then ``summarize`` writes the summary, curves,
strata, the band metric by optimizer steps and by tokens trained, and the paired differences per seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

GREEDY_MIN = 0.8
SAMPLED = (0.05, 0.5)
ZERO_VAR_MIN = 0.2
PREFIX = "d3s_outcome"
ARMS = ["grpo", "cross", "full", "intra"]


def _model_and_data(overrides: list[str]):
    from pods.compose import compose_plain
    from pods.config import validate
    from pods.tasks import DATASETS
    from pods.tiny import ensure_tiny, load_tokenizer

    cfg = compose_plain([f"experiment={PREFIX}_grpo_cpu", *overrides])
    root = validate(cfg)
    path = ensure_tiny(cfg["model"]["spec"], cfg["model"].get("cache_dir"))
    data = DATASETS.get(cfg["dataset"]["name"])(root.dataset)
    return path, load_tokenizer(path), data, cfg


def _answers_ok(texts: list[str], gold: str) -> list[bool]:
    from pods.tasks.toy_sum import _END

    return [(m := _END.search(t)) is not None and m.group(1) == gold for t in texts]


def probe(out: Path, overrides: list[str], prompts: int = 40, samples: int = 8, seed: int = 7) -> dict:
    """Per term count: greedy accuracy, T = 1 accuracy, zero-variance share of groups of ``samples``, answer_prob."""
    import torch
    from transformers import AutoModelForCausalLM

    from pods.tasks.toy_long import sft_target
    from pods.tasks.toy_sum import terms_of

    path, tok, data, cfg = _model_and_data(overrides)
    model = AutoModelForCausalLM.from_pretrained(str(path)).float().eval()
    torch.manual_seed(seed)
    max_new = cfg["sampling"]["max_tokens"]
    rows = {}
    for k in range(cfg["dataset"]["min_terms"], cfg["dataset"]["max_terms"] + 1):
        exs = [ex for ex in data.train if terms_of(ex) == k][:prompts]
        greedy, sampled, zero, probs = [], [], [], []
        for ex in exs:
            ids = tok.apply_chat_template(list(ex.messages), add_generation_prompt=True, return_tensors="pt", return_dict=True)
            ids = ids["input_ids"]
            with torch.no_grad():
                g = model.generate(ids, do_sample=False, max_new_tokens=max_new)
                s = model.generate(ids.repeat(samples, 1), do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new)
                ans = tok(sft_target(ex) + "<|im_end|>", add_special_tokens=False, return_tensors="pt")["input_ids"]
                logits = model(torch.cat([ids, ans], 1)).logits[0, ids.shape[1] - 1 : -1]
                probs.append(float(logits.log_softmax(-1).gather(1, ans[0][:, None]).sum().exp()))
            greedy += _answers_ok([tok.decode(g[0, ids.shape[1] :], skip_special_tokens=True)], ex.gold)
            ok = _answers_ok(tok.batch_decode(s[:, ids.shape[1] :], skip_special_tokens=True), ex.gold)
            sampled += ok
            zero.append(all(ok) or not any(ok))
        rows[k] = {
            "greedy": round(statistics.fmean(greedy), 3),
            "sampled": round(statistics.fmean(sampled), 3),
            "zero_var": round(statistics.fmean(zero), 3),
            "answer_prob": round(statistics.fmean(probs), 3),
            "prompts": len(exs),
        }
    zero_all = statistics.fmean(r["zero_var"] for r in rows.values())
    gate = {
        "greedy": all(r["greedy"] >= GREEDY_MIN for r in rows.values()),
        "sampled": all(SAMPLED[0] <= r["sampled"] <= SAMPLED[1] for r in rows.values()),
        "zero_var": zero_all >= ZERO_VAR_MIN,
    }
    result = {"model": path.name, "overrides": overrides, "per_terms": rows, "zero_var": round(zero_all, 3), "gate": gate,
              "held": all(gate.values()), "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with (out / "probe.jsonl").open("a") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))
    return result


LABEL = {"grpo": "GRPO 8/8", "cross": "samples across groups", "full": "full D3S (schedule)", "intra": "samples within groups"}
SUMMARY = ["arm", "seed", "steps", "train_time_s", "tokens_trained", "kept_per_step", "acc_test_start", "acc_test_final",
           "answer_prob_start", "answer_prob_final", "zero_var", "entropy_ratio"]  # fmt: skip
PAIRED = ["arm", "seed", "metric", "arm_final", "grpo_final", "difference", "arm_mean", "grpo_mean", "difference_mean"]


def eval_curve(rows: list[dict], x: str, y: str):
    """(xs [K], ys [K]) of the run's evaluations: ``y`` against the optimizer step or the tokens trained up to it."""
    import numpy as np

    tokens, total = {0: 0}, 0
    for r in rows:
        if r["kind"] == "train":
            total += r["tokens_trained"]
            tokens[r["step"]] = total
    pts = {(r["step"] if x == "step" else tokens[r["step"]]): r[y] for r in rows if r["kind"] == "eval" and r.get(y) is not None}
    xs = np.array(sorted(pts), dtype=float)
    return xs, np.array([pts[k] for k in sorted(pts)], dtype=float)


def table(runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    """One ``SUMMARY`` row per arm and seed (the mixed ablation's run row, with the start's evaluation beside)."""
    from pods.results.d3s_mixed import run_row

    out = []
    for arm, seeds in runs.items():
        for seed, rows in sorted(seeds.items()):
            r, first = run_row(arm, seed, rows), next(e for e in rows if e["kind"] == "eval")
            out.append({**{k: r.get(k) for k in SUMMARY}, "acc_test_start": first["accuracy"], "answer_prob_start": first["answer_prob"]})
    return out


def paired(runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    """Per arm other than GRPO, seed (same prompts in both arms) and metric: the final evaluation and the mean over the
    evaluations after the start, the arm's, GRPO's and their difference."""
    out = []
    for arm in [a for a in runs if a != "grpo"]:
        for seed in sorted(set(runs[arm]) & set(runs.get("grpo", {}))):
            for metric in ("accuracy", "answer_prob"):
                a, g = (eval_curve(runs[k][seed], "step", metric)[1] for k in (arm, "grpo"))
                out.append({"arm": arm, "seed": seed, "metric": metric, "arm_final": round(a[-1], 4), "grpo_final": round(g[-1], 4),
                            "difference": round(a[-1] - g[-1], 4), "arm_mean": round(a[1:].mean(), 4), "grpo_mean": round(g[1:].mean(), 4),
                            "difference_mean": round(a[1:].mean() - g[1:].mean(), 4)})  # fmt: skip
    return out


def bands(runs: dict[str, dict[int, list[dict]]], n_boot: int = 2000) -> list[dict]:
    """The band metric (``pods.results.speedup``, the demo's band) of each arm over GRPO, by optimizer steps and by
    tokens trained, on test accuracy and on answer_prob: pooled, per seed pair, and the bootstrap interval."""
    from pods.results.speedup import band_speedup

    out = []
    for arm in [a for a in runs if a != "grpo"]:
        seeds = sorted(set(runs[arm]) & set(runs.get("grpo", {})))
        for x in ("step", "tokens"):
            for y in ("accuracy", "answer_prob"):
                base = [eval_curve(runs["grpo"][s], x, y) for s in seeds]
                r = band_speedup(base, [eval_curve(runs[arm][s], x, y) for s in seeds], n_boot=n_boot)
                out.append({"arm": arm, "x": x, "y": y, "speedup": round(r["speedup"], 3), "lo": r["lo"] and round(r["lo"], 3),
                            "hi": r["hi"] and round(r["hi"], 3), "pairs": [round(p, 3) for p in r["pairs"]], "never": r["never"], "seeds": seeds})  # fmt: skip
    return out


def _mean(rows: list[dict], arm: str, key: str) -> float:
    return statistics.fmean(r[key] for r in rows if r["arm"] == arm)


def _band(bs: list[dict], arm: str, x: str, y: str) -> float:
    return next(b["speedup"] for b in bs if (b["arm"], b["x"], b["y"]) == (arm, x, y))


def predictions(tab: list[dict], pairs: list[dict], bs: list[dict]) -> list[dict]:
    """The registered predictions (docs/d3s.md "Outcome", quoted commit), each held or failed by its rule."""
    gain = {k: _mean(tab, "grpo", f"{k}_final") - _mean(tab, "grpo", f"{k}_start") for k in ("acc_test", "answer_prob")}
    out = [{"prediction": "a: GRPO learns: mean final - start >= 0.05 on test accuracy AND on answer_prob", "value": gain,
            "held": min(gain.values()) >= 0.05}]  # fmt: skip
    if any(b["arm"] == "cross" for b in bs):
        steps = {y: _band(bs, "cross", "step", y) for y in ("accuracy", "answer_prob")}
        toks = {y: _band(bs, "cross", "tokens", y) for y in ("accuracy", "answer_prob")}
        out.append({"prediction": "b: by optimizer steps across-groups is neither much faster nor much slower than GRPO: pooled band "
                    "speed-up in [0.7, 1.4] on test accuracy AND answer_prob (the paper's >= 1.57x does not appear)", "value": steps,
                    "held": all(0.7 <= v <= 1.4 for v in steps.values())})  # fmt: skip
        out.append({"prediction": "c: by tokens trained across-groups is faster: pooled band speed-up >= 1.4 on test accuracy AND answer_prob",
                    "value": toks, "held": all(v >= 1.4 for v in toks.values())})  # fmt: skip
    if any(b["arm"] == "full" for b in bs) and any(b["arm"] == "cross" for b in bs):
        v = {"full": _band(bs, "full", "step", "answer_prob"), "cross": _band(bs, "cross", "step", "answer_prob")}
        out.append({"prediction": "d: by optimizer steps full D3S is slower than across-groups alone (band speed-up over GRPO on "
                    "answer_prob, full < cross): the token rule drops most stray-token positions", "value": v, "held": v["full"] < v["cross"]})  # fmt: skip
    for arm in ("cross", "full"):
        ds = [p["difference"] for p in pairs if p["arm"] == arm and p["metric"] == "answer_prob"]
        if ds:
            m, se = statistics.fmean(ds), (statistics.stdev(ds) / len(ds) ** 0.5 if len(ds) > 1 else float("nan"))
            out.append({"prediction": f"e: final answer_prob, {arm} - GRPO paired by seed: |mean| < 0.05", "value": round(m, 4),
                        "se": round(se, 4), "per_seed": ds, "held": abs(m) < 0.05})  # fmt: skip
    for p in out[1:]:  # (a) is the gate: without GRPO learning there is nothing to reach sooner
        p["informative"] = out[0]["held"]
    return out


def plot(runs: dict[str, dict[int, list[dict]]], path: Path) -> None:
    """Mean test accuracy and answer_prob against optimizer steps and tokens trained, one line per arm."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    for i, y in enumerate(("accuracy", "answer_prob")):
        for j, x in enumerate(("step", "tokens")):
            ax = axes[i][j]
            for arm, seeds in runs.items():
                cs = [eval_curve(rows, x, y) for rows in seeds.values()]
                ax.plot(np.mean([c[0] for c in cs], 0), np.mean([c[1] for c in cs], 0), marker="o", label=LABEL[arm])
            ax.set_xlabel("optimizer step" if x == "step" else "tokens trained")
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel(f"test {y} (mean over seeds)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("toy_sum (2-5 terms), re-blurred tiny Qwen2, CPU: D3S's outcome")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(out: Path, seeds: list[int] | None = None, arms: list[str] = ARMS, n_boot: int = 2000) -> list[dict]:
    """summary.csv, paired.csv, bands.json, predictions.json and accuracy.png from the finished runs under ``out/runs``."""
    from pods.results.d3s_mixed import load
    from pods.results.report import write_csv

    runs = load(out, seeds, arms)
    if "grpo" not in runs:
        raise SystemExit(f"no finished GRPO run under {out / 'runs'}")
    tab, pairs, bs = table(runs), paired(runs), bands(runs, n_boot)
    write_csv(tab, out / "summary.csv", SUMMARY)
    if pairs:
        write_csv(pairs, out / "paired.csv", PAIRED)
    (out / "bands.json").write_text(json.dumps(bs, indent=1) + "\n")
    pred = predictions(tab, pairs, bs)
    (out / "predictions.json").write_text(json.dumps(pred, indent=1) + "\n")
    plot(runs, out / "accuracy.png")
    for p in pred:
        print(p)
    return pred


def main(argv: list[str] | None = None) -> None:
    from pods.numerics import pin

    pin()  # before torch loads: the model is built (once) with the shipped models' numerics
    ap = argparse.ArgumentParser(prog="python -m pods.results.d3s_outcome", description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["probe", "reproduce", "summarize"])
    ap.add_argument("--out", type=Path, default=Path("results/cpu/d3s_outcome"))
    ap.add_argument("--runs", type=Path, default=Path("runs/d3s_outcome"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=ARMS)
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE overrides (probe: of the model; reproduce: of every run)")
    args = ap.parse_intermixed_args(argv)
    if args.what == "probe":
        probe(args.out, args.overrides, args.prompts)
    elif args.what == "reproduce":
        from pods.results.d3s_mixed import reproduce

        reproduce(args.seeds, args.out, args.runs, args.overrides, args.arms, prefix=PREFIX)
        summarize(args.out, args.seeds, args.arms)
    else:
        summarize(args.out, args.seeds, args.arms)


if __name__ == "__main__":
    main()
