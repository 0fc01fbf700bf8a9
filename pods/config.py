"""Validate a resolved config (a plain dict) before any model or dataset is loaded.

Every error names the offending key. Names are checked against the registries, so a typo lists the
valid choices.
"""

from __future__ import annotations

import os

from pods.registry import Registry


class ConfigError(ValueError):
    pass


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _name(registry: Registry, value, key: str) -> None:
    if value not in registry:
        raise ConfigError(f"{key}: unknown {registry.kind} '{value}'; valid: {', '.join(registry.names())}")


def validate(cfg: dict) -> dict:
    """The config typed and completed by the schema (``pods.schema.check``), then checked across fields; returns it."""
    from pods.advantages import ADVANTAGES
    from pods.backends import BACKENDS, OPTIMIZERS
    from pods.downsample import RULES
    from pods.engines import ENGINES
    from pods.losses import AGGREGATIONS, POLICY_LOSSES
    from pods.models import check_model_available
    from pods.schedules import SCHEDULES
    from pods.schema import check
    from pods.tasks import DATASETS, GRADERS, RECIPES
    from pods.tokens import CORRECTIONS, TOKEN_SELECTORS

    cfg = check(cfg)  # every key present and typed: the rules below read them without defaults
    a, t, hw = cfg["algorithm"], cfg["train"], cfg["hardware"]
    n, m = a["n"], a["m"]
    _need(isinstance(n, int) and n >= 1, f"algorithm.n must be an integer >= 1, got {n!r}")
    _need(isinstance(m, int) and m >= 1, f"algorithm.m must be an integer >= 1, got {m!r}")
    _need(m <= n, f"algorithm.m ({m}) must be <= algorithm.n ({n}): m rollouts are kept out of n")
    _name(RULES, a["rule"], "algorithm.rule")
    if a["grad_accum"]:
        _need(a["rule"] == "all", f"algorithm.grad_accum trains all n rollouts: algorithm.rule must be 'all', got '{a['rule']}'")
        _need(n % m == 0, f"algorithm.grad_accum: algorithm.n ({n}) must be divisible by algorithm.m ({m}), the micro-batch")
    elif a["rule"] == "all":
        _need(m == n, f"algorithm.rule 'all' keeps every rollout: algorithm.m ({m}) must equal algorithm.n ({n})")
    _name(ADVANTAGES, a["advantage"], "algorithm.advantage")
    lt = a["loss_temperature"]
    _need(
        lt == "sampling" or (isinstance(lt, (int, float)) and not isinstance(lt, bool) and lt > 0),
        f"algorithm.loss_temperature must be 'sampling' or a number > 0, got {lt!r}",
    )
    _name(POLICY_LOSSES, a["policy_loss"], "algorithm.policy_loss")
    _name(AGGREGATIONS, a["loss_agg"], "algorithm.loss_agg")
    _name(TOKEN_SELECTORS, a["token_rule"], "algorithm.token_rule")
    _name(CORRECTIONS, a["correction"], "algorithm.correction")
    _d3s(a, RULES, TOKEN_SELECTORS)
    _need(a["epsilon"] > 0, f"algorithm.epsilon must be > 0, got {a['epsilon']}")
    _need(float(a["beta"]) >= 0, "algorithm.beta must be >= 0")
    _need(int(a["ppo_epochs"]) >= 1, "algorithm.ppo_epochs must be >= 1")
    _name(ENGINES, cfg["rollout"]["name"], "rollout.name")
    _sparse_rl(cfg)
    _name(BACKENDS, hw["backend"], "hardware.backend")
    _need(hw["finetune"] in ("lora", "full"), f"hardware.finetune must be 'lora' or 'full', got '{hw['finetune']}'")
    _need(int(hw["micro_batch_size"]) >= 1, "hardware.micro_batch_size must be >= 1")
    quant = cfg["model"]["quantization"]
    _need(quant in (None, "4bit"), f"model.quantization must be null or '4bit', got '{quant}'")
    if quant:
        _need(hw["finetune"] == "lora", "model.quantization=4bit trains a LoRA adapter on a frozen 4-bit base: set hardware.finetune=lora")
        _need(
            str(hw["device"]).startswith("cuda"),
            "model.quantization=4bit needs bitsandbytes on a CUDA device (hardware.device=cuda); use model.quantization=null on CPU",
        )
    _name(OPTIMIZERS, cfg["optim"]["name"], "optim.name")
    _name(SCHEDULES, cfg["optim"]["schedule"], "optim.schedule")
    _need(cfg["optim"]["lr"] > 0, "optim.lr must be > 0")
    ds = cfg["dataset"]
    _name(DATASETS, ds["name"], "dataset.name")
    _name(RECIPES, ds["recipe"], "dataset.recipe")
    _name(GRADERS, ds["grader"], "dataset.grader")
    _need(t["prompts_per_step"] >= 1, "train.prompts_per_step must be >= 1")
    _need(t["prompts_per_step"] % t["group_repeats"] == 0, "train.group_repeats must divide train.prompts_per_step")
    _need(t["max_steps"] or t["time_budget_s"], "set train.max_steps or train.time_budget_s (or both)")
    _need(cfg["sampling"]["temperature"] > 0, "sampling.temperature must be > 0 for RL rollouts")
    _need(cfg["sampling"]["max_tokens"] >= 1, "sampling.max_tokens must be >= 1")
    _need(t["old_logprobs"] in ("policy", "sampler"), "train.old_logprobs must be 'policy' or 'sampler'")
    _checkpoints(t)
    _context(cfg["rollout"])
    _launcher(hw, cfg["rollout"])
    check_model_available(cfg["model"])
    return cfg


def _d3s(a: dict, rules: Registry, selectors: Registry) -> None:
    """D3S keys (pods.d3s): advantage scope, the (N, K) schedule, the token fraction."""
    from pods.schedules import RAMPS

    scope = a["advantage_scope"]
    _need(scope in ("kept", "group"), f"algorithm.advantage_scope must be 'kept' or 'group', got '{scope}'")
    cross = getattr(rules.get(a["rule"]), "cross_group", False)
    _need(
        not cross or scope == "group", f"algorithm.rule '{a['rule']}' selects on full-group advantages: set algorithm.advantage_scope=group"
    )
    _name(RAMPS, a["ramp"], "algorithm.ramp")
    m_final = a["m_final"]
    if m_final is not None:
        _need(
            isinstance(m_final, int) and 1 <= m_final <= a["n"],
            f"algorithm.m_final must be an integer in [1, n={a['n']}] (or null), got {m_final!r}",
        )
        _need(not a["grad_accum"], "algorithm.m_final (a schedule of kept rollouts) cannot be used with algorithm.grad_accum")
        _need(a["rule"] != "all", "algorithm.m_final needs a down-sampling rule; rule 'all' keeps every rollout")
    for key in getattr(selectors.get(a["token_rule"]), "fraction_keys", ()):  # d3s_top_k: token_keep(_final)
        v, optional = a.get(key), key.endswith("_final")
        ok = (v is None and optional) or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1)
        _need(ok, f"algorithm.{key} must be a fraction in (0, 1]{' or null' if optional else ''}, got {v!r}")


def _checkpoints(t: dict) -> None:
    from pods.checkpoint import END_CHOICES, end_mode

    _need(
        end_mode(t) in END_CHOICES, f"train.checkpoint_at_end must be one of {', '.join(END_CHOICES)}, got {t.get('checkpoint_at_end')!r}"
    )
    keep = t["keep_checkpoints"]
    _need(
        keep is None or (isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1),
        f"train.keep_checkpoints must be null or an integer >= 1, got {keep!r}",
    )
    every = t["checkpoint_every_s"]
    _need(every is None or every > 0, f"train.checkpoint_every_s must be null or > 0, got {every!r}")


def _context(r: dict) -> None:
    """An engine with a sequence budget (vLLM: ``max_model_len``) must fit the longest prompt + completion."""
    if "prompt_budget" not in r:
        return
    need = None if r["prompt_budget"] is None else int(r["prompt_budget"]) + max(int(x) for x in r["completion_budget"])
    given = r.get("max_model_len")
    _need(
        given is not None or need is not None,
        "rollout.max_model_len is null and dataset.max_prompt_length is null: set one (null would give vLLM the model's whole context and its KV cache)",
    )
    _need(
        given is None or need is None or int(given) >= need,
        f"rollout.max_model_len ({given}) < dataset.max_prompt_length + max(sampling.max_tokens, eval.max_tokens) ({need}): raise it or set it to null (derived)",
    )


def _launcher(hw: dict, rollout: dict) -> None:
    """A multi-GPU profile started as one process (``python -m pods.train``, a Hydra multirun through the submitit
    launcher) would train on 1 of its GPUs without a word: refuse it. torchrun sets WORLD_SIZE."""
    nproc, world = int(hw["nproc_per_node"]), os.environ.get("WORLD_SIZE")
    _need(
        nproc == 1 or world is not None,
        f"hardware.nproc_per_node={nproc} ({hw.get('name')}) needs one process per GPU, but this is a single process "
        f"without a launcher (WORLD_SIZE unset; a Hydra multirun starts one): submit each run with `sbatch slurm/run_8gpu.sbatch experiment=... seed=...` "
        f"or start it with `torchrun --nproc_per_node {nproc} -m pods.train ...`",
    )
    timeout = hw["dist_timeout_s"]
    _need(timeout is None or float(timeout) > 0, f"hardware.dist_timeout_s must be null or > 0 seconds, got {timeout!r}")
    _need(
        not (rollout.get("multiprocessing") and int(world or 1) > 1),
        "rollout.multiprocessing=true cannot run under torchrun: vLLM's external launcher keeps each rank's engine in its process",
    )


def _sparse_rl(cfg: dict) -> None:
    """Sparse-RL: the compressed-KV engine's budget/method and the correction's thresholds."""
    if cfg["rollout"]["name"] == "sparse_hf":
        from pods.engines.sparse_hf import check

        try:
            check(cfg["rollout"])
        except ValueError as e:
            _need(False, str(e).replace("unknown KV compression method", "rollout.method: unknown KV compression method"))
    if (cfg["algorithm"]["correction"]) == "sparse_rl":
        from pods.sparse_rl import WEIGHT_NORMS, settings

        c = settings(cfg["algorithm"])
        _need(
            c["weight_norm"] in WEIGHT_NORMS,
            f"algorithm.sparse_rl.weight_norm must be one of {', '.join(WEIGHT_NORMS)}, got '{c['weight_norm']}'",
        )
        _need(
            0 <= c["band_low"] < c["band_high"],
            f"algorithm.sparse_rl.band_low < band_high required, got [{c['band_low']}, {c['band_high']}]",
        )
        _need(c["veto"] > 0 and c["cap"] > 0 and c["log_ratio_clamp"] > 0, "algorithm.sparse_rl.veto, cap and log_ratio_clamp must be > 0")
