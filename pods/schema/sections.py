"""The sections of the configuration: every key, its type, its range, its one default, and the rules between
keys of one section (validators); the engine, hardware and algorithm sections live in ``pods.schema.rollouts``,
``pods.schema.hardware`` and ``pods.schema.algorithm``, imported here. ``pods.schema.check`` builds the typed ``Root``
from a composed plain dict.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Field, model_validator

from pods.errors import need
from pods.schema.algorithm import Algorithm, SparseRl  # noqa: F401 - re-exported: pods.schema names every section
from pods.schema.base import Files, Frac, NonNegF, Pos, PosF, Section, where  # noqa: F401
from pods.schema.hardware import DeepSpeed, Hardware, Lora, Slurm  # noqa: F401
from pods.schema.rollouts import ROLLOUTS, HfRollout, SparseHfRollout, VllmRollout, VllmServerRollout  # noqa: F401 - re-exported


class Sampling(Section):
    """How completions are drawn: the one set of sampling keys and defaults, read by every engine. The training run's
    ``sampling`` (the loss divides logits by the same temperature: > 0 there, ``Root``), the evaluation's ``eval`` and a
    benchmark suite (``pods.eval.benchmarks.Suite``) are this section with keys of their own added."""

    temperature: NonNegF = 1.0  # 0 = greedy
    top_p: Frac = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1  # -1 = off
    max_tokens: Pos = 12  # max completion tokens
    stop: list[str] = []  # extra stop strings (the end-of-turn token always stops)


MAX_REFILL = 32  # train.refill_batches: DAPO's recipe allows 10 generation batches per step; more is a run that never trains


class Train(Section):
    prompts_per_step: Pos = 2  # prompt groups per optimizer step (per rank)
    group_repeats: Pos = 1  # each distinct prompt fills this many groups of a step (must divide prompts_per_step)
    max_steps: Pos | None = None  # optimizer steps; null = until the time budget
    time_budget_s: PosF | None = 120.0  # training seconds (evaluation and checkpointing excluded)
    old_logprobs: Literal["policy", "sampler"] = "policy"
    checkpoint_every_s: PosF | None = None
    checkpoint_every_steps: Pos | None = None
    checkpoint_at_end: Literal["full", "weights", False] = "full"
    keep_checkpoints: Pos | None = None  # keep the newest k; null = all
    resume: str | None = None  # null | auto | /path/to/step_XXXXXX.pt
    start_over: bool = False  # a fresh run into a directory holding a run: move that run aside (<dir>.old<k>), never delete it
    save_final: bool = False
    sampler_gap_warn: PosF | None = None  # warn above this mean |trainer - sampler| log-prob gap; null = by dtype (pods.backends.gap)
    # dynamic sampling (DAPO; pods.loop.rollouts, docs/knobs.md): drop groups of zero reward variance, refill from more prompt batches
    group_filter: Literal["none", "nonzero_std"] = "none"
    refill_batches: Annotated[int, Field(ge=0)] = 0  # extra prompt batches generated at most per step to refill dropped groups
    # asynchronous rollouts (pods.loop.producer, docs/async.md): 0 = the synchronous loop; k >= 1 = a producer thread
    # generates ahead, and no row trained by update u has a token older than policy version u - 1 - k
    max_staleness: Annotated[int, Field(ge=0)] = 0
    log_strata: bool = False  # per prompt length: groups, zero-variance groups, kept and correct rollouts (pods.d3s.strata)

    @model_validator(mode="after")
    def _horizon(self) -> Train:
        need(self.prompts_per_step % self.group_repeats == 0, "train.group_repeats must divide train.prompts_per_step")
        need(self.max_steps or self.time_budget_s, "set train.max_steps or train.time_budget_s (or both)")
        need(not self.refill_batches or self.group_filter != "none", "train.refill_batches needs train.group_filter (nonzero_std)")
        need(
            self.refill_batches <= MAX_REFILL,
            f"train.refill_batches must be <= {MAX_REFILL}, got {self.refill_batches}: each is one more generation of the step's "
            "prompts, so a step of zero-variance groups would generate that many batches before it trains",
        )
        k, steps = self.max_staleness, self.max_steps
        need(
            not (k and steps and k > steps),
            f"train.max_staleness must be <= train.max_steps ({steps}), got {k}: no row of a {steps}-step run can be that stale, "
            "so the bound would hold nothing back (a larger train.max_steps or a smaller bound)",
        )
        need(not (self.start_over and self.resume), "train.start_over=true starts the run again and train.resume continues it: set one")
        return self


class Optim(Section):
    name: str | None = None  # pods.backends.OPTIMIZERS; null = the hardware profile's (hardware.optimizer)
    lr: NonNegF = 1.0e-4  # 0: the weights never change (the asynchronous loop's bit-equality check, docs/async.md)
    betas: Annotated[list[Annotated[float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = [0.9, 0.99]
    eps: PosF = 1.0e-8
    weight_decay: NonNegF = 0.0
    max_grad_norm: PosF | None = 1.0  # null = no clipping
    schedule: str = "constant"  # pods.schedules.SCHEDULES, over training progress
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.0


class Eval(Sampling):
    """The evaluation: what it samples (the ``Sampling`` keys; conf/config.yaml sets them to the training run's) and when."""

    at_start: bool = True
    every_s: PosF | None = 15.0  # seconds of TRAINING time
    every_steps: Pos | None = None
    max_examples: Pos | None = 200  # null = all
    repeats: Pos = 4
    seed: int = 12345
    # the benchmark suite run once the training ends (pods-eval on the final weights; conf/suite/), null = none
    suite: str | None = None
    suite_engine: Literal["hf", "vllm"] = "hf"  # a dense engine, whatever engine trained
    suite_overrides: list[str] = []  # suite.KEY=VALUE, as pods-eval takes them


class Model(Section):
    name: str
    builder: str | None = None  # pods.models.BUILDERS: builds the model directory on first use
    path: str | None = None  # hub id or local directory
    cache_dir: str | None = None  # default: $PODS_CACHE or <repo>/.cache
    spec: dict[str, Any] = {}  # builder options (tiny: overrides of pods.tiny.DEFAULT_SPEC)
    quantization: Literal["4bit"] | None = None  # 4bit: bitsandbytes NF4 base under a LoRA adapter (GPU only)
    chat_template_kwargs: dict[str, Any] = {}  # passed to every apply_chat_template (Qwen3: {enable_thinking: false})


class Hub(Section):
    id: str
    configs: list[str] | None = None
    split: str
    data_dir: str | None = None  # a folder of the hub repository holding the split's files (SimpleRL-Zoo-Data: one per data set)


class HubDataset(Section):
    name: str  # pods.tasks.DATASETS
    recipe: str  # pods.tasks.RECIPES
    grader: str  # pods.tasks.GRADERS
    prompt_format: str = "pods_instruct"  # pods.tasks.prompts.PROMPTS
    max_prompt_length: Pos | None = 512  # prompts longer than this (tokens) are dropped (and counted)
    grade_timeout_s: PosF | None = 5.0  # wall-clock limit per grading call, in a worker process; null = in-process
    train_hub: Hub | None = None
    test_hub: Hub | None = None
    train_files: Files = None  # local json/jsonl/parquet/csv file(s), used instead of train_hub
    test_files: Files = None
    train_size: Pos | None = None  # the first N records (null = all)
    test_size: Pos | None = None


class ToyDataset(Section):
    name: str
    recipe: str
    grader: str
    max_prompt_length: Pos | None = 128
    grade_timeout_s: PosF | None = None  # the toy grader is one regex over 200 characters (cannot hang): in-process
    low: int = 10
    high: int = 99
    train_size: Annotated[int, Field(ge=0)] = 4000  # 0: a test split only (the toy benchmarks, conf/benchmark/)
    test_size: Pos = 200
    seed: int = 1234


class ToyLongDataset(ToyDataset):
    """toy_long: add min_terms..max_terms numbers step by step (pods.tasks.toy_long)."""

    min_terms: Pos = 4
    max_terms: Pos = 6


class NoLogger(Section):
    name: str


class Wandb(Section):
    name: str
    project: str = "pods"
    entity: str | None = None
    group: str | None = None  # null = the experiment's name; a multirun without one: its sweep directory
    run_name: str | None = None  # null = "<algorithm> n=<n> m=<m> <rule> seed=<seed>"
    run_id: str | None = None  # null = made at the first start, kept in <run_dir>/wandb/pods-run-id, reused on resume
    tags: list[str] = []
    mode: Literal["online", "offline", "disabled"] = "offline"
    completions: Annotated[int, Field(ge=0)] = 8  # sampled completions per evaluation in the W&B table; 0 = none


Rollout = Union[tuple(ROLLOUTS.values())]  # noqa: UP007 - one shape per engine (pods.schema.rollouts.ROLLOUTS)


class Root(Section):
    is_root: ClassVar[bool] = True
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0  # NumPy takes 0..2**32 - 1; the run seeds seed + rank
    model: Model
    dataset: HubDataset | ToyLongDataset | ToyDataset
    rollout: Rollout
    hardware: Hardware
    algorithm: Algorithm
    logger: NoLogger | Wandb = NoLogger(name="none")
    sampling: Sampling = Sampling()
    train: Train = Train()
    optim: Optim = Optim()
    eval: Eval = Eval()

    @model_validator(mode="after")
    def _sampling(self) -> Root:
        t = self.sampling.temperature  # the training run's rollouts: the loss divides the logits by it (eval may be greedy)
        need(t > 0, f"sampling.temperature must be > 0, got {t!r}")
        return self

    @model_validator(mode="after")
    def _overlong(self) -> Root:
        buf, top = self.algorithm.overlong_buffer, self.sampling.max_tokens
        need(buf is None or buf < top, f"algorithm.overlong_buffer ({buf}) must be < sampling.max_tokens ({top})")
        return self

    @model_validator(mode="after")
    def _behaviour_is(self) -> Root:
        on = "behaviour_is" in ([self.algorithm.correction] if isinstance(self.algorithm.correction, str) else self.algorithm.correction)
        need(
            not (on and self.train.old_logprobs == "sampler"),
            "algorithm.correction=behaviour_is with train.old_logprobs=sampler: the clipped ratio is then already pi/pi_sampler, "
            "and the weights would count it twice; use train.old_logprobs=policy",
        )
        return self

    @model_validator(mode="after")
    def _optimizer(self) -> Root:
        if self.optim.name is None:  # the profile's optimizer unless the run names one
            self.optim.name = self.hardware.optimizer
        return self


# group -> {option name: model}; "*" is every other name (a test's engine registered under its own name: all shapes tried)
SHAPES: dict[str, dict[str, type[Section] | tuple[type[Section], ...]]] = {
    "model": {"*": Model},
    "dataset": {
        "toy_arith": ToyDataset,
        "toy_long": ToyLongDataset,
        "toy_sum": ToyLongDataset,
        "*": (HubDataset, ToyDataset, ToyLongDataset),
    },
    "rollout": {
        **ROLLOUTS,
        "*": (HfRollout, VllmRollout, SparseHfRollout),
    },
    "logger": {"none": NoLogger, "wandb": Wandb, "*": (NoLogger, Wandb)},
}
