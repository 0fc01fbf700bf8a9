"""The rules that read the registries, run after the schema (``pods.schema.check``) typed the config and checked
each section's own rules: every name a config gives (rule, loss, engine, grader, ...) exists, the plug-ins' own
checks (``Engine.check``, ``Backend.check``) pass, and the launcher and the model fit. Nothing the schema already
guarantees is checked again here.

Every error names the offending key; a typo lists the valid choices. Nothing here touches the machine
(``pods.preflight`` does), so a GPU experiment validates on a CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

from pods.errors import ConfigError, need
from pods.registry import Registry
from pods.schema import Root, check

__all__ = ["ConfigError", "validate"]


def _name(registry: Registry, value, key: str) -> None:
    if value not in registry:
        raise ConfigError(f"{key}: {registry.unknown(value)}")


def validate(cfg: dict | Root) -> Root:
    """The config typed and completed by the schema, then checked against the registries and the plug-ins."""
    from pods.backends import BACKENDS, OPTIMIZERS
    from pods.engines import ENGINES
    from pods.models import check_model_available
    from pods.schedules import SCHEDULES
    from pods.tasks import DATASETS, GRADERS, RECIPES

    cfg = check(cfg)
    _algorithm(cfg.algorithm)
    _name(ENGINES, cfg.rollout.name, "rollout.name")
    _name(BACKENDS, cfg.hardware.backend, "hardware.backend")
    _name(OPTIMIZERS, cfg.optim.name, "optim.name")
    _name(SCHEDULES, cfg.optim.schedule, "optim.schedule")
    for key in ("name", "recipe", "grader"):
        _name({"name": DATASETS, "recipe": RECIPES, "grader": GRADERS}[key], getattr(cfg.dataset, key), f"dataset.{key}")
    ENGINES.get(cfg.rollout.name).check(cfg)  # the engine's own rules (budgets, launcher, compression)
    BACKENDS.get(cfg.hardware.backend).check(cfg)
    _launcher(cfg)
    _asynchronous(cfg, ENGINES.get(cfg.rollout.name).needs_sync)
    _suite(cfg.eval)
    _token_budget(cfg)
    check_model_available(cfg.model)
    return cfg


def _token_budget(cfg: Root) -> None:
    """``hardware.micro_batch_tokens`` below one row at its longest: allowed (the estimate and the tests use it), said in
    one warning, since every row longer than the budget then trains as a micro-batch of its own."""
    from pods.log import get

    budget, prompt, completion = cfg.hardware.micro_batch_tokens, getattr(cfg.dataset, "max_prompt_length", None), cfg.sampling.max_tokens
    row = (prompt or 0) + completion
    if budget is not None and budget < row:
        get(__name__).warning(
            f"hardware.micro_batch_tokens={budget} is below one row (up to {row} tokens: dataset.max_prompt_length {prompt} + "
            f"sampling.max_tokens {completion}): each row longer than it trains as a micro-batch of its own, one forward and "
            "backward per row"
        )


def _asynchronous(cfg: Root, needs_sync: bool) -> None:
    """``train.max_staleness >= 1`` (docs/async.md): the trainer draws from no RNG, and a policy engine's frozen copy
    is a local module, so several processes need an engine that holds its own copy of the weights (its producer's
    collectives run on a group of their own: ``pods.distributed.Dist.fork``)."""
    hw, world = cfg.hardware, int(os.environ.get("WORLD_SIZE", "1"))
    if not cfg.train.max_staleness:
        return
    procs = max(world, hw.nproc_per_node * hw.nnodes)
    need(  # HF / sparse HF under DeepSpeed: every rank's forwards over the ZeRO-3 module gather its shards in lockstep
        needs_sync or procs == 1,
        f"train.max_staleness >= 1 with rollout.name={cfg.rollout.name} runs in one process (this run has {procs}): under DeepSpeed "
        "the ranks generate with the training module itself (ZeRO-3: in lockstep, each forward gathering its shards), which a "
        "producer thread cannot do while the module trains; use rollout=vllm_server (or vllm), or set train.max_staleness=0",
    )
    need(
        hw.finetune != "lora" or hw.lora.dropout == 0,
        "train.max_staleness >= 1 needs hardware.lora.dropout=0 (the trainer would draw from the RNG the producer samples with)",
    )
    need(needs_sync or hw.backend == "local", f"train.max_staleness >= 1 with rollout.name={cfg.rollout.name} needs hardware.backend=local")


def _algorithm(a) -> None:
    """Names in the algorithm's registries, and the rules that depend on what a named rule or selector is."""
    from pods.advantages import ADVANTAGES
    from pods.downsample import RULES
    from pods.losses import AGGREGATIONS, POLICY_LOSSES
    from pods.schedules import RAMPS
    from pods.tokens import CORRECTIONS, TOKEN_SELECTORS, correction_names

    _name(RULES, a.rule, "algorithm.rule")
    _name(ADVANTAGES, a.advantage, "algorithm.advantage")
    _name(POLICY_LOSSES, a.policy_loss, "algorithm.policy_loss")
    _name(AGGREGATIONS, a.loss_agg, "algorithm.loss_agg")
    _name(TOKEN_SELECTORS, a.token_rule, "algorithm.token_rule")
    for name in correction_names(a):  # one name, or a list run in turn
        _name(CORRECTIONS, name, "algorithm.correction")
    need(
        not {"sparse_rl", "behaviour_is"} <= set(correction_names(a)),
        "algorithm.correction=[sparse_rl,behaviour_is] would weight by pi_old/sampler twice: sparse_rl's weights already "
        "correct against whatever sampler made the tokens, stale or compressed; use algorithm.correction=sparse_rl",
    )
    cross = RULES.spec(a.rule).cross_group
    need(
        not cross or a.advantage_scope == "group",
        f"algorithm.rule '{a.rule}' selects on full-group advantages: set algorithm.advantage_scope=group",
    )
    _name(RAMPS, a.ramp, "algorithm.ramp")
    for key in TOKEN_SELECTORS.spec(a.token_rule).fraction_keys:  # d3s_top_k: token_keep(_final)
        v, optional = getattr(a, key), key.endswith("_final")
        need(v is not None or optional, f"algorithm.{key} must be a fraction in (0, 1]{' or null' if optional else ''}, got {v!r}")


def _suite(ev) -> None:
    """``eval.suite`` names a shipped suite (conf/suite/), checked before the run rather than after it."""
    if ev.suite is None:
        return
    suites = sorted(p.stem for p in (Path(__file__).resolve().parent / "conf" / "suite").glob("*.yaml"))
    need(ev.suite in suites, f"eval.suite: unknown suite '{ev.suite}'; valid: {', '.join(suites)}")
    bad = [o for o in ev.suite_overrides if not o.lstrip("+~").startswith("suite.")]
    need(not bad, f"eval.suite_overrides: '{bad[0] if bad else ''}' is not a suite key (e.g. suite.samples=4)")


def _launcher(cfg: Root) -> None:
    """A multi-GPU profile started as one process (``python -m pods.train``, a Hydra multirun through the submitit
    launcher) would train on 1 of its GPUs without a word: refuse it. torchrun sets WORLD_SIZE."""
    hw = cfg.hardware
    nproc, world = hw.nproc_per_node, os.environ.get("WORLD_SIZE")
    need(
        nproc == 1 or world is not None,
        f"hardware.nproc_per_node={nproc} ({hw.name}) needs one process per GPU, but this is a single process "
        f"without a launcher (WORLD_SIZE unset; a Hydra multirun starts one): submit each run with `sbatch slurm/run_8gpu.sbatch experiment=... seed=...` "
        f"or start it with `torchrun --nproc_per_node {nproc} -m pods.train ...`",
    )
    quant = cfg.model.quantization
    if quant:
        need(hw.finetune == "lora", "model.quantization=4bit trains a LoRA adapter on a frozen 4-bit base: set hardware.finetune=lora")
        need(
            hw.device == "cuda",
            "model.quantization=4bit needs bitsandbytes on a CUDA device (hardware.device=cuda); use model.quantization=null on CPU",
        )
