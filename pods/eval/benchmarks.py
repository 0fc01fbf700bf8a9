"""Benchmarks and suites as typed sections (``conf/benchmark/*.yaml``, ``conf/suite/*.yaml``) and the loader that
turns a benchmark into ``Example``s.

A benchmark names where its records come from (``hub`` or local ``files``; or ``loader: dataset`` for a pods dataset
builder such as the toy tasks), which columns hold the question, the gold answer and the problem id, how the gold is
read out of its column (``gold``: a name in ``GOLDS``), and the grader that fits it. The prompt is the suite's.
"""

from __future__ import annotations

from typing import Any

from pods.compose import CONF, compose_job, hydra_context, to_plain
from pods.errors import ConfigError
from pods.registry import Registry

# the run config's sections (strict, unknown keys refused) and its one registration of config nodes
from pods.schema import Hub, Pos, Sampling, Section, defaults, register, validated
from pods.tasks.base import Example

GOLDS = Registry("gold format")
LOADERS = Registry("benchmark loader")


class Benchmark(Section):
    name: str
    loader: str = "records"  # LOADERS: records (hub / files) | dataset (a pods dataset builder's test split)
    hub: Hub | None = None
    files: str | list[str] | None = None  # local json/jsonl/parquet/csv in the hub copy's column layout, instead of hub
    question: str = "problem"  # column holding the question
    answer: str = "answer"  # column holding the gold answer
    gold: str = "plain"  # GOLDS: how the gold is read out of the answer column
    id: str | None = None  # column holding the problem id (null = "<name>/<row index>")
    grader: str = "math_verify"  # pods.tasks.GRADERS
    size: Pos | None = None  # the first N problems (null = all)
    dataset: dict[str, Any] = {}  # loader=dataset: the builder's config (name and its keys)


class Suite(Sampling):
    """A benchmark suite: how it samples (the ``Sampling`` keys and defaults, ``suite.max_tokens``, ...) and what it runs."""

    name: str
    benchmarks: dict[str, Benchmark]
    only: list[str] | None = None  # evaluate just these benchmarks of the suite
    prompt: str | None = None  # pods.tasks.prompts.PROMPTS; null = the run's training prompt (pods_instruct for a plain model)
    chat_template_kwargs: dict[str, Any] | None = None  # apply_chat_template's extra arguments; null = the run's (final/'s), else none
    grader: str | None = None  # null = each benchmark's grader
    samples: Pos = 1  # completions per problem
    ks: list[Pos] | None = None  # pass@k / maj@k; null = 1, 2, 4, ... up to samples
    max_prompt_length: Pos | None = None  # longer prompts are dropped (and counted); null = keep all
    seed: int = 0
    per_benchmark: dict[str, dict[str, Any]] = {}  # name -> {samples, max_tokens, ks} for that benchmark only


class Plan(Section):
    """One benchmark's settings after the suite's per-benchmark overrides."""

    samples: Pos
    max_tokens: Pos
    ks: list[Pos] | None = None


def check_suite(cfg: dict) -> Suite:
    """The composed suite validated (``pods.schema``'s one-line messages), the names in it checked, every k <= its
    samples; ``ConfigError`` in one line."""
    from pods.tasks import GRADERS
    from pods.tasks.prompts import PROMPTS

    suite = validated(Suite, cfg, "suite")
    unknown = [b for b in (suite.only or []) + list(suite.per_benchmark) if b not in suite.benchmarks]
    if unknown:
        raise ConfigError(f"suite '{suite.name}': unknown benchmark '{unknown[0]}'; valid: {', '.join(sorted(suite.benchmarks))}")
    for name, b in suite.benchmarks.items():
        for registry, value in ((LOADERS, b.loader), (GOLDS, b.gold), (GRADERS, suite.grader or b.grader)):
            if value not in registry:
                raise ConfigError(f"benchmark '{name}': {registry.unknown(value)}")
        plan = plan_for(suite, name)
        bad = [k for k in plan.ks or [] if k > plan.samples]
        if bad:
            raise ConfigError(f"benchmark '{name}': k = {bad[0]} > samples = {plan.samples} (pass@k needs k <= samples per problem)")
    if suite.prompt is not None and suite.prompt not in PROMPTS:
        raise ConfigError(f"suite.prompt: unknown prompt format '{suite.prompt}'; valid: {', '.join(PROMPTS.names())}")
    return suite


def plan_for(suite: Suite, name: str) -> Plan:
    base = {"samples": suite.samples, "max_tokens": suite.max_tokens, "ks": suite.ks}
    return validated(Plan, {**base, **suite.per_benchmark.get(name, {})}, f"suite.per_benchmark.{name}")


def selected(suite: Suite) -> list[str]:
    return list(suite.only) if suite.only else list(suite.benchmarks)


# --- gold answers -----------------------------------------------------------------------------------------


@GOLDS.register("plain")
def gold_plain(value) -> str | None:
    """The column as it is (numbers written canonically: AMC23's 27.0 -> "27")."""
    from pods.tasks.mathds import math_gold

    return math_gold({"answer": value}) if value is not None and str(value).strip() else None


@GOLDS.register("gsm8k")
def gold_gsm8k(value) -> str | None:
    """GSM8K's solution: the text after "####", commas removed."""
    from pods.tasks.gsm8k import gsm8k_gold

    return gsm8k_gold(str(value))


@GOLDS.register("boxed")
def gold_boxed(value) -> str | None:
    """A worked solution: the content of its last \\boxed{...}, braces matched."""
    from pods.tasks.extract import last_boxed

    return last_boxed(str(value))


@GOLDS.register("first")
def gold_first(value) -> str | None:
    """A list of answers (OlympiadBench's ``final_answer``): the first, without $ delimiters around it."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return str(items[0]).strip().strip("$").strip() if items and items[0] is not None else None


# --- loaders ----------------------------------------------------------------------------------------------


@LOADERS.register("records")
def load_records(b: Benchmark, prompt: str) -> list[Example]:
    """Hub or local records -> Examples: question column through the prompt, gold through ``GOLDS[b.gold]``."""
    from pods.tasks.hub import field, load_files, load_hub
    from pods.tasks.prompts import PROMPTS

    if b.files:
        records = load_files(b.files, key=f"suite.benchmarks.{b.name}.files")
    elif b.hub:
        records = load_hub(b.hub.model_dump(), b.hub.split, name=b.name, files_key=f"suite.benchmarks.{b.name}.files")
    else:
        raise ConfigError(f"benchmark '{b.name}': neither hub nor files is set")
    to_prompt, to_gold = PROMPTS.get(prompt), GOLDS.get(b.gold)
    out = []
    for i, rec in enumerate(records[: b.size] if b.size else records):
        where = f"benchmark '{b.name}' record {i}"
        gold = to_gold(field(rec, (b.answer,), where))
        if not gold:
            raise ConfigError(f"{where}: no gold answer in column '{b.answer}' (gold format '{b.gold}')")
        messages, text = to_prompt(str(field(rec, (b.question,), where)))
        uid = str(rec[b.id]) if b.id and rec.get(b.id) is not None else f"{b.name}/{i}"
        out.append(Example(messages=messages, gold=gold, id=uid, prompt_text=text))
    return out


@LOADERS.register("dataset")
def load_dataset_split(b: Benchmark, prompt: str) -> list[Example]:
    """A pods dataset builder's test split (the toy tasks: their own prompt, so ``prompt`` is not used). ``dataset`` is
    validated as the builder's section (``pods.schema.SHAPES``); its recipe is not read, its grader is the benchmark's."""
    from pods.schema import SHAPES
    from pods.tasks import DATASETS

    name = b.dataset.get("name")
    if name not in DATASETS:
        raise ConfigError(f"dataset.name: unknown dataset '{name}'; valid: {', '.join(DATASETS.names())}")
    shape = SHAPES["dataset"].get(name)
    if not isinstance(shape, type):
        raise ConfigError(f"loader dataset reads the toy tasks' test splits, not '{name}' (use files or hub)")
    data = DATASETS.get(name)(shape.of({"recipe": "correctness", "grader": b.grader, **b.dataset})).test
    return data[: b.size] if b.size else data


def load_benchmark(b: Benchmark, prompt: str) -> list[Example]:
    return LOADERS.get(b.loader)(b, prompt)


# --- composition ------------------------------------------------------------------------------------------


SUITES = CONF / "suite"  # conf/suite/<name>.yaml


def suites() -> list[str]:
    return sorted(p.stem for p in SUITES.glob("*.yaml"))


def nodes() -> dict[str, dict]:
    """The schema defaults as ``benchmark/_base`` and ``suite/_base`` (every key present, so overrides need no ``+``)."""
    return {f"{group}/_base": defaults(model) for group, model in (("benchmark", Benchmark), ("suite", Suite))}


def compose_suite(name: str, overrides: list[str] | None = None) -> Suite:
    """``conf/suite/<name>.yaml`` with ``suite.``-prefixed overrides (``suite.samples=4``,
    ``suite.benchmarks.math500.files=/data/math500.jsonl``), checked; ``ConfigError`` in one line.

    Composed with Hydra's compose API: inside an initialised Hydra (``pods.train``'s app, its preflight) with that one,
    never a second initialisation (Hydra refuses one: "GlobalHydra is already initialized"); else in its own."""
    from hydra.core.global_hydra import GlobalHydra

    if name not in suites():
        raise ConfigError(f"unknown suite '{name}'; valid: {', '.join(suites())}")
    overrides = list(overrides or [])
    bad = [o for o in overrides if not o.lstrip("+~").startswith("suite.")]
    if bad:
        raise ConfigError(f"suite override '{bad[0]}': overrides are suite keys, e.g. suite.samples=4 or suite.only=[gsm8k]")
    for key in {o.lstrip("+~").split("=", 1)[0].split(".")[1] for o in overrides} - set(Suite.model_fields):
        validated(Suite, {"name": name, "benchmarks": {}, key: None}, "suite")  # the schema's message: closest valid key
    register(nodes())
    if GlobalHydra.instance().is_initialized():
        cfg = compose_job(overrides, config_name=f"suite/{name}")
    else:
        with hydra_context("pods-eval"):
            cfg = compose_job(overrides, config_name=f"suite/{name}")
    return check_suite(to_plain(cfg.suite))  # not job_dict: it would set the running app's HydraConfig
