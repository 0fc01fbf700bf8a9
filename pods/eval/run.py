"""Generate and grade one suite: per benchmark, ``samples`` completions per problem, graded by the benchmark's grader
(or the suite's), then avg@n, pass@k and maj@k (pods.eval.metrics). Writes samples.jsonl, table.md, config.json."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch


def build_engine(target, args):
    """(engine, tokenizer): the HF engine over the loaded model, or vLLM over a directory holding the same weights."""
    from pods.eval.weights import load
    from pods.models import load_tokenizer

    tok = load_tokenizer(target.base)
    if args.engine == "hf":
        from pods.engines.hf import HFEngine

        model, base = load(target, args.device, args.dtype)
        return HFEngine(base, tok, {"max_batch": args.max_batch}, policy=model), tok
    from pods.engines.vllm import VLLMEngine
    from pods.schema import VllmRollout, complete

    model_dir = target.base
    if target.kind != "model":  # vLLM loads a directory: write the run's weights (a LoRA merged in) to one
        model, _ = load(target, "cpu", args.dtype)
        model = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
        model_dir = tempfile.mkdtemp(prefix="pods-eval-")
        model.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    return VLLMEngine(model_dir, tok, complete(VllmRollout, name="vllm", dtype=args.dtype)), tok


def answer_key(extracted: str | None) -> str | None:
    """What majority voting compares: the normalised extracted answer."""
    from pods.tasks.extract import normalize

    return normalize(extracted) if extracted else None


def run_benchmark(engine, tok, suite, name: str, examples: list, samples_file) -> dict:
    """Generate, grade, write one row per completion; returns this benchmark's metrics."""
    from pods.engines import Sampling
    from pods.eval.benchmarks import plan_for
    from pods.eval.metrics import Problem, benchmark_metrics, default_ks
    from pods.tasks import encode_prompts, score_batch

    plan, bench = plan_for(suite, name), suite.benchmarks[name]
    grader = suite.grader or bench.grader
    ids, kept, dropped = encode_prompts(examples, tok, suite.max_prompt_length)
    sampling = Sampling(temperature=suite.temperature, top_p=suite.top_p, top_k=suite.top_k, max_tokens=plan.max_tokens, seed=suite.seed)
    torch.manual_seed(suite.seed)
    ro = engine.generate(ids, plan.samples, sampling, progress=True)
    golds = [ex.gold for ex in kept for _ in range(plan.samples)]
    scores = score_batch(ro.texts, golds, "correctness", grader, timeout_s=5.0)
    problems = []
    for i, ex in enumerate(kept):
        rows = range(i * plan.samples, (i + 1) * plan.samples)
        for j, r in enumerate(rows):
            s = scores[r]
            row = {"benchmark": name, "problem_id": ex.id, "sample": j, "gold": ex.gold, "completion": ro.texts[r]}
            row |= {"extracted": s.extracted, "correct": s.correct, "finish_reason": ro.finish_reasons[r]}
            samples_file.write(json.dumps(row, ensure_ascii=False) + "\n")
        problems.append(Problem(tuple(scores[r].correct for r in rows), tuple(answer_key(scores[r].extracted) for r in rows)))
    metrics = benchmark_metrics(problems, plan.ks or default_ks(plan.samples))
    return {
        **metrics,
        "grader": grader,
        "dropped_long_prompts": dropped,
        "max_tokens": plan.max_tokens,
        "mean_tokens": ro.num_tokens / max(1, len(ro.texts)),
    }


def table(per: dict, macro: dict) -> str:
    """A markdown table: one row per benchmark, then the macro average."""
    ks = sorted({k for m in per.values() for k in m["pass@k"]}, key=int)
    head = ["benchmark", "problems", "samples", "avg@n"] + [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks if k != "1"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(m: dict) -> list[str]:
        get = lambda key, k: f"{m[key][k]:.4f}" if k in m[key] else "-"  # noqa: E731
        return [f"{m['avg@n']:.4f}"] + [get("pass@k", k) for k in ks] + [get("maj@k", k) for k in ks if k != "1"]

    for name, m in per.items():
        lines.append("| " + " | ".join([name, str(m["problems"]), str(m["samples"]), *cells(m)]) + " |")
    if len(per) > 1:
        lines.append("| " + " | ".join(["macro average", "", "", *cells(macro)]) + " |")
    return "\n".join(lines) + "\n"


def evaluate_suite(suite, target, data: dict, prompt: str, out: Path, args) -> dict:
    from pods.eval.metrics import macro_average

    out.mkdir(parents=True, exist_ok=True)
    engine, tok = build_engine(target, args)
    per = {}
    with (out / "samples.jsonl").open("w", encoding="utf-8") as f:
        for name, examples in data.items():
            print(f"[pods-eval] {name}: {len(examples)} problems", flush=True)
            per[name] = run_benchmark(engine, tok, suite, name, examples, f)
    macro = macro_average(per)
    (out / "table.md").write_text(table(per, macro))
    config = {"suite": suite.model_dump(), "model": args.model, "weights": str(target.weights or target.base), "kind": target.kind}
    config |= {"engine": args.engine, "prompt": prompt, "device": args.device, "dtype": args.dtype}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"suite": suite.name, "model": args.model, "weights": config["weights"], "prompt": prompt, "benchmarks": per, "macro": macro}
