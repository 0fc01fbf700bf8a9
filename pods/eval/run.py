"""Evaluate a model on a suite: ``evaluate_suite(suite, target, options, out)``, the one function behind ``pods-eval``
and a training run's ``eval.suite``. Per benchmark, ``samples`` completions per problem, graded by the benchmark's
grader (or the suite's), then avg@n, pass@k and maj@k (pods.eval.metrics). Writes summary.json, table.md,
samples.jsonl and config.json."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Literal

import torch

from pods.errors import ConfigError
from pods.eval.benchmarks import Suite, load_benchmark, selected
from pods.eval.weights import Target
from pods.schema import Frac, Pos, Section, validated


class Options(Section):
    """How a suite is generated: the engine (a name in ``pods.engines.ENGINES``: ``--engine``, ``eval.suite_engine``),
    the device and dtype the weights load in, and the sequences per generate call (engines that batch by count). An
    engine that sizes its own cache (vLLM) gets ``max_model_len`` (None: the suite's longest prompt + completion, never
    the model's whole context) and ``gpu_memory_utilization`` (None: the engine's default)."""

    engine: str = "hf"
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_batch: Pos = 64
    max_model_len: Pos | None = None
    gpu_memory_utilization: Frac | None = None


def check_options(options: Options) -> None:
    """The engine exists and can be imported here; ``ConfigError`` in one line, before anything loads."""
    import importlib.util

    from pods.engines import ENGINES

    if options.engine not in ENGINES:
        raise ConfigError(f"engine: {ENGINES.unknown(options.engine)}")
    package = ENGINES.spec(options.engine).package
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(f"engine {options.engine}: {package} is not installed (pip install '.[cpu]' or '.[gpu]'), or use engine hf")


def has_cuda() -> bool:
    return torch.cuda.is_available()


def check_target(target: Target, options: Options) -> None:
    """A run trained over a 4-bit base is evaluated over that base (bitsandbytes NF4, as it trained, as ``pods-export``
    merges it): it needs ``--device cuda`` and a CUDA GPU; ``ConfigError`` in one line, before anything loads."""
    from pods.eval.weights import quantization

    if quantization(target) != "4bit":
        return
    if not options.device.startswith("cuda") or not has_cuda():
        where = "no CUDA device is visible" if options.device.startswith("cuda") else f"--device is {options.device}"
        raise ConfigError(
            f"{target.run_dir or target.base} trained on a 4-bit base (model.quantization=4bit): it is evaluated over that "
            f"base, which needs bitsandbytes on a CUDA GPU (--device cuda); {where}"
        )


def suite_prompt(suite: Suite, run_cfg: dict | None) -> str:
    """The suite's prompt, else the run's training prompt, else ``pods_instruct`` (a plain model)."""
    return suite.prompt or (run_cfg or {}).get("dataset", {}).get("prompt_format") or "pods_instruct"


def template_kwargs(suite: Suite, target: Target) -> dict:
    """The chat template's extra arguments (Qwen3's ``enable_thinking``): the suite's, else the run's
    ``model.chat_template_kwargs``, else those a ``final/`` directory records (``pods_final.json``), else none."""
    if suite.chat_template_kwargs is not None:
        return dict(suite.chat_template_kwargs)
    if target.run_cfg:
        return dict(target.run_cfg.get("model", {}).get("chat_template_kwargs") or {})
    note = Path(target.weights or target.base) / "pods_final.json"
    return dict(json.loads(note.read_text()).get("chat_template_kwargs") or {}) if note.is_file() else {}


def load_suite(suite: Suite, prompt: str) -> dict[str, list]:
    """{benchmark: examples} of the selected benchmarks; a missing file or column is a ``ConfigError`` in one line."""
    data = {}
    for name in selected(suite):
        try:
            data[name] = load_benchmark(suite.benchmarks[name], prompt)
        except (ValueError, FileNotFoundError) as e:  # ConfigError included: one line, named by its benchmark
            raise ConfigError(f"benchmark '{name}': {e}") from None
    return data


def context_length(suite: Suite, data: dict[str, list], tok) -> int:
    """The longest sequence the suite asks for: its prompt bound (``suite.max_prompt_length``, else the longest prompt
    of ``data`` as the engine will see it) + the largest completion budget of its benchmarks."""
    from pods.eval.benchmarks import plan_for
    from pods.tasks import encode_prompts

    longest = suite.max_prompt_length
    if longest is None:
        longest = max((len(ids) for examples in data.values() for ids in encode_prompts(examples, tok, None)[0]), default=1)
    return int(longest) + max((plan_for(suite, name).max_tokens for name in data), default=suite.max_tokens)


def engine_settings(cls, options: Options, context: int | None) -> dict:
    """The keys of ``options`` the engine's section takes (its name, batch, dtype; vLLM: the sequence length, given or
    ``context``, and the memory share when one is given)."""
    given = {"name": options.engine, "max_batch": options.max_batch, "dtype": options.dtype}
    given |= {"max_model_len": options.max_model_len or context, "gpu_memory_utilization": options.gpu_memory_utilization}
    return {k: v for k, v in given.items() if k in cls.section.model_fields and v is not None}


def build_engine(target: Target, options: Options, stack: ExitStack, near: Path, context: int | None = None):
    """(engine, tokenizer) from ``pods.engines.ENGINES``: an engine that samples with a module gets the loaded weights;
    one that loads its own copy (vLLM) gets a directory holding them: a plain model directory as it is, else the
    weights written plain (a LoRA merged in) into a temporary directory beside ``near`` that ``stack`` deletes
    (``pods.eval.merge.engine_dir``), and ``engine_settings`` (``context``: the suite's longest sequence)."""
    from pods.engines import ENGINES
    from pods.engines.base import PolicyEngine
    from pods.eval.merge import engine_dir
    from pods.eval.weights import load, quantization
    from pods.models import load_tokenizer

    cls, tok = ENGINES.get(options.engine), load_tokenizer(target.tokenizer or target.base)
    quantized = quantization(target) == "4bit"  # the adapter over the NF4 base it trained on, not over the bf16 base
    section = validated(cls.section, engine_settings(cls, options, context), "engine")
    if issubclass(cls, PolicyEngine):
        model, base = load(target, options.device, options.dtype, quantized=quantized)
        return cls(base, tok, section, policy=model), tok
    return cls(stack.enter_context(engine_dir(target, options.dtype, tok, near)), tok, section), tok


def sizes_cache(options: Options) -> bool:
    """Whether the engine sizes a cache of its own from a sequence length (vLLM): it is given the suite's."""
    from pods.engines import ENGINES

    return "max_model_len" in ENGINES.get(options.engine).section.model_fields and options.max_model_len is None


def answer_key(extracted: str | None) -> str | None:
    """What majority voting compares: the normalised extracted answer."""
    from pods.tasks.extract import normalize

    return normalize(extracted) if extracted else None


def run_benchmark(engine, tok, suite, name: str, examples: list, samples_file, chat: dict | None = None) -> dict:
    """Generate, grade, write one row per completion; returns this benchmark's metrics. ``chat``: the chat template's
    extra arguments (``template_kwargs``)."""
    from pods.engines import Sampling
    from pods.eval.benchmarks import plan_for
    from pods.eval.metrics import Problem, benchmark_metrics, default_ks
    from pods.tasks import encode_prompts, score_batch

    plan, bench = plan_for(suite, name), suite.benchmarks[name]
    grader = suite.grader or bench.grader
    ids, kept, dropped = encode_prompts(examples, tok, suite.max_prompt_length, chat)
    sampling = Sampling.draw(suite.model_copy(update={"max_tokens": plan.max_tokens}), seed=suite.seed)
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


def recorded(options: Options) -> dict:
    """What config.json records of the options (the engine, device, dtype; a cache size or share when one was set)."""
    return {k: v for k, v in options.model_dump(exclude={"max_batch"}).items() if v is not None}


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


def evaluate_suite(suite: Suite, target: Target, options: Options, out: Path, data: dict | None = None) -> dict:
    """Evaluate ``target`` on ``suite`` and write ``out``/{summary.json, table.md, samples.jsonl, config.json}; the
    summary. ``data``: the benchmarks already loaded (``load_suite``), else loaded here before the model."""
    from pods.eval.metrics import macro_average
    from pods.models import load_tokenizer

    start = time.time()
    check_options(options)
    check_target(target, options)
    prompt, chat = suite_prompt(suite, target.run_cfg), template_kwargs(suite, target)
    data = load_suite(suite, prompt) if data is None else data
    with ExitStack() as stack:  # a temporary weights directory (vLLM) is deleted when the evaluation ends, or fails
        context = context_length(suite, data, load_tokenizer(target.tokenizer or target.base)) if sizes_cache(options) else None
        engine, tok = build_engine(target, options, stack, out, context)
        out.mkdir(parents=True, exist_ok=True)  # after the model loaded: a failure leaves no empty directory behind
        per = {}
        with (out / "samples.jsonl").open("w", encoding="utf-8") as f:
            for name, examples in data.items():
                print(f"[pods-eval] {name}: {len(examples)} problems", flush=True)
                per[name] = run_benchmark(engine, tok, suite, name, examples, f, chat)
    macro = macro_average(per)
    (out / "table.md").write_text(table(per, macro))
    model, weights = str(target.run_dir or target.base), str(target.weights or target.base)
    config = {"suite": suite.model_dump(), "model": model, "weights": weights, "kind": target.kind, "prompt": prompt}
    config["chat_template_kwargs"] = chat
    (out / "config.json").write_text(json.dumps(config | recorded(options), indent=2) + "\n")
    summary = {"suite": suite.name, "model": model, "weights": weights, "prompt": prompt, "benchmarks": per, "macro": macro}
    summary["seconds"] = round(time.time() - start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
