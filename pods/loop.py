"""The training loop: GRPO, GRPO-GA and GRPO-PODS are one loop with different config values.

Each step: (1) sample prompts, (2) generate n rollouts per prompt, (3) score them, (4) down-sample to m
per prompt group with the named rule, (5) advantages on the kept m (D3S: on the full group of n, before (4), and
the rule reads them), (5b) token-level corrections and selection, (6) policy update, (7) sync weights
into the engine, (8) log, (9) evaluate on the training clock's schedule, (10) checkpoint.
GRPO is rule ``all`` with m = n; GRPO-GA keeps all n and trains them in micro-batches of m with one
optimizer step; PODS keeps m of n. The training clock (``train_time``) excludes evaluation and
checkpointing, so curves of accuracy against training time compare algorithms fairly.

``train(cfg, run_dir)`` takes a plain dict (no Hydra), so tests and scripts call it directly.

Several processes (``torchrun --nproc_per_node N -m pods.train hardware=h100x8_zero3 ...``): each rank runs
this same loop on its own ``train.prompts_per_step`` prompts, with its own engine; a prompt group never
spans ranks, so (4)-(5) are unchanged; the backend reduces gradients in (6). ``pods.distributed`` keeps the
clock and the stop decision identical on every rank and reduces what is logged; only rank 0 writes files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from pods import checkpoint, distributed, tokens
from pods.advantages import ADVANTAGES
from pods.backends import BACKENDS, build_batch
from pods.config import validate
from pods.d3s import sample_count
from pods.data import PromptSampler
from pods.downsample import kept_rows
from pods.engines import ENGINES, Sampling
from pods.evaluate import evaluate
from pods.log import setup
from pods.metrics import MetricsLogger
from pods.models import load_tokenizer, resolve_model_dir
from pods.schedules import SCHEDULES
from pods.signals import StopFlag
from pods.tasks import DATASETS, encode_prompts, score_batch


def progress_of(state: dict, t: dict) -> float:
    """Fraction of the run's horizon used: by optimizer steps and/or training seconds, whichever is further."""
    p = 0.0
    if t["max_steps"]:
        p = max(p, state["step"] / t["max_steps"])
    if t["time_budget_s"]:
        p = max(p, state["train_time"] / t["time_budget_s"])
    return min(p, 1.0)


def rollout_step(
    cfg: dict,
    engine,
    backend,
    prompts: list[list[int]],
    golds: list[str],
    gen: torch.Generator,
    lr: float,
    pad_id: int,
    dist=distributed.SINGLE,
    progress: float = 0.0,
) -> dict:
    """Steps (2)-(7) for one batch of prompts; returns the step's metrics (timings in seconds; reward
    statistics over every rank's groups). ``progress`` is the training progress in [0, 1]."""
    a, ds, t = cfg["algorithm"], cfg["dataset"], cfg["train"]
    n, G = a["n"], len(prompts)
    keep = n if a["grad_accum"] else sample_count(a, progress)  # m, or D3S's N(p) when algorithm.m_final is set
    s = cfg["sampling"]
    clock = time.perf_counter()
    ro = engine.generate(prompts, n, Sampling(s["temperature"], s["top_p"], s["top_k"], s["max_tokens"], stop=tuple(s["stop"])))  # (2)
    t_gen = time.perf_counter()
    scores = score_batch(ro.texts, [g for g in golds for _ in range(n)], ds["recipe"], ds["grader"], timeout_s=ds["grade_timeout_s"])  # (3)
    rewards = torch.tensor([sc.reward for sc in scores], dtype=torch.float64).view(G, n)
    t_score = time.perf_counter()
    group_adv = ADVANTAGES.get(a["advantage"])(rewards) if a["advantage_scope"] == "group" else None  # D3S: A on the full group
    kept = kept_rows(a["rule"], rewards if group_adv is None else group_adv, keep, generator=gen)  # (4) [G * keep] flat row indices
    kept_rewards = rewards.flatten()[kept]
    all_rewards, all_kept = dist.all_gather(rewards), dist.all_gather(kept_rewards)  # for logging: every rank's groups
    t_select = time.perf_counter()
    if group_adv is None:  # (5) PODS/GRPO: on the kept rollouts only (per-group rules: keep per group)
        adv = ADVANTAGES.get(a["advantage"])(kept_rewards.view(G, keep)).float().flatten()
    else:  # (5) D3S: the full-group advantages of the kept rollouts, not re-normalised
        adv = group_adv.flatten()[kept].float()
    rows = kept.tolist()
    batch = build_batch(
        [prompts[r // n] for r in rows],
        [ro.completion_ids[r] for r in rows],
        [ro.logprobs[r] for r in rows],
        adv,
        pad_id,
        groups=[r // n for r in rows],
    )
    if t["old_logprobs"] == "sampler":
        batch.old_logprobs = batch.sampler_logprobs
    token_metrics = tokens.apply(batch, backend, a, progress, dist)  # (5b) corrections, token selection: loss_mask / token_weights
    micro = min(G * a["m"], backend.micro_batch_size) if a["grad_accum"] else None
    stats = backend.update(batch, lr, micro_batch_size=micro)  # (6)
    t_update = time.perf_counter()
    if engine.needs_sync:
        engine.load_weights(backend.export_weights())  # (7)
    t_sync = time.perf_counter()
    terms = {k: sum(sc.terms[k] for sc in scores) / len(scores) for k in scores[0].terms}
    return {
        **stats,
        "t_generate": t_gen - clock,
        "t_score": t_score - t_gen,
        "t_select": t_select - t_score,
        "t_update": t_update - t_select,
        "t_sync": t_sync - t_update,
        "reward_mean_all": all_rewards.mean().item(),
        "reward_std_all": all_rewards.std().item() if all_rewards.numel() > 1 else 0.0,
        "reward_mean_kept": all_kept.mean().item(),
        "reward_std_kept": all_kept.std().item() if all_kept.numel() > 1 else 0.0,
        "zero_var_groups": (all_rewards.std(dim=1) == 0).float().mean().item() if n > 1 else 1.0,
        "kept": int(kept.numel()),
        "train_accuracy": sum(sc.correct for sc in scores) / len(scores),
        "tokens": ro.num_tokens,
        "tokens_trained": int(batch.loss_mask.sum()),
        "truncated": ro.finish_reasons.count("length") / len(scores),
        "timeouts": sum(sc.timed_out for sc in scores),
        **{f"reward_{k}": v for k, v in terms.items()},
        **ro.metrics,
        **token_metrics,
    }


def _due(last: float, now: float, every: float | None) -> bool:
    return bool(every) and now - last >= every


def train(cfg: dict, run_dir: str | Path) -> dict:
    """Run one experiment; returns the last eval row. Writes config.json, metrics.jsonl, checkpoints/."""
    cfg = validate(cfg)  # (0) typed and complete (the schema's defaults), checked, before any model or dataset is loaded
    hw, t, ev, ds, a = cfg["hardware"], cfg["train"], cfg["eval"], cfg["dataset"], cfg["algorithm"]
    dist = distributed.init(hw)  # this process's rank (one process: rank 0 of 1, every collective a no-op)
    log = setup(dist.rank)  # rank 0 logs (under Hydra into <run_dir>/train.log); the other ranks only warn
    run_dir = Path(dist.broadcast(str(run_dir)))  # rank 0's (Hydra's timestamped name can differ by a second)
    run_dir.mkdir(parents=True, exist_ok=True)
    if dist.is_main:
        (run_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    if hw["torch_threads"]:
        torch.set_num_threads(int(hw["torch_threads"]))
    torch.manual_seed(cfg["seed"] + dist.rank)  # each rank samples its own rollouts
    task = DATASETS.get(ds["name"])(ds)  # data first: a missing file fails before the model loads
    model_dir = resolve_model_dir(cfg["model"])
    tok = load_tokenizer(model_dir)
    train_ids, train_ex, dropped = encode_prompts(task.train, tok, ds["max_prompt_length"])
    test_ids, test_ex, _ = encode_prompts(task.test[: ev["max_examples"]], tok, ds["max_prompt_length"])
    backend = BACKENDS.get(hw["backend"])(model_dir, cfg)
    engine = ENGINES.get(cfg["rollout"]["name"])(model_dir, tok, cfg["rollout"], policy=backend.policy)
    sampler = PromptSampler(
        len(train_ids), t["prompts_per_step"], cfg["seed"], dist.rank, dist.world, t["group_repeats"]
    )  # prompts per rank
    gen = torch.Generator().manual_seed(cfg["seed"] + dist.rank)  # the random down-sampling rule's stream
    state = {"step": 0, "train_time": 0.0, "last_eval": 0.0, "last_ckpt": 0.0, "evals": 0}
    ckpt_dir = run_dir / "checkpoints"
    resume = t["resume"]
    if resume:
        path = checkpoint.latest(ckpt_dir) if resume == "auto" else Path(resume)
        if path is not None:
            state, extra = checkpoint.load(path, backend, sampler, dist)
            gen.set_state(extra["select"])
            if dist.is_main:
                log.info(f"resumed from {path} at step {state['step']}")
    if (
        engine.needs_sync
    ):  # the engine serves the trainer's policy from the first eval on (a 4-bit base: its NF4 values), or the resumed one
        engine.load_weights(backend.export_weights())
    logger = MetricsLogger(run_dir, cfg, enabled=dist.is_main, resume_step=state["step"] if resume else None)
    if state["step"] == 0:
        logger.log(
            {
                "kind": "setup",
                "step": 0,
                "model_dir": str(model_dir),
                "train_prompts": len(train_ids),
                "dropped_prompts": dropped,
                "test_prompts": len(test_ids),
                "world_size": dist.world,
            }
        )
    schedule, lr0 = SCHEDULES.get(cfg["optim"]["schedule"]), cfg["optim"]["lr"]
    golds = [ex.gold for ex in train_ex]
    lockstep = backend.collective_forward and not engine.needs_sync  # generating with the ZeRO-3 module: equal eval shards
    test_ids, test_golds = dist.shard(test_ids, [ex.gold for ex in test_ex], lockstep=lockstep)  # each rank scores its share

    def run_eval() -> dict:
        scores = dist.reduce_eval(evaluate(engine, test_ids, test_golds, ev, ds, ev["seed"] + state["evals"]))
        row = {"kind": "eval", "step": state["step"], "train_time": state["train_time"], **scores}
        state["evals"] += 1
        state["last_eval"] = state["train_time"]
        logger.log(row)
        return row

    def save() -> None:
        checkpoint.save(
            ckpt_dir / f"step_{state['step']:06d}.pt",
            state,
            backend,
            sampler,
            {"select": gen.get_state()},
            dist,
            keep=t["keep_checkpoints"],
        )
        state["last_ckpt"] = state["train_time"]

    def finished() -> bool:
        return bool(
            (t["max_steps"] and state["step"] >= t["max_steps"]) or (t["time_budget_s"] and state["train_time"] >= t["time_budget_s"])
        )

    stop = StopFlag().install()  # (SLURM pre-emption) -> checkpoint at the next step boundary, then exit
    last = run_eval() if ev["at_start"] and state["step"] == 0 else {}
    from tqdm import tqdm

    bar = tqdm(
        total=t["max_steps"], initial=state["step"], desc=f"{a['name']} n={a['n']} m={a['m']}", dynamic_ncols=True, disable=not dist.is_main
    )
    while not finished() and not dist.any(stop.requested):  # a signal to one rank stops them all
        clock = time.perf_counter()
        idx = sampler.next()  # (1) this rank's prompts
        p = progress_of(state, t)
        lr = lr0 * schedule(p, cfg["optim"]["warmup_ratio"])
        row = rollout_step(
            cfg, engine, backend, [train_ids[i] for i in idx], [golds[i] for i in idx], gen, lr, tok.pad_token_id, dist, p
        )  # (2)-(7)
        row = dist.reduce_metrics(row)
        state["step"] += 1
        state["train_time"] += dist.max(time.perf_counter() - clock)  # the slowest rank's time: one clock for all
        logger.log({"kind": "train", "step": state["step"], "train_time": state["train_time"], **row})  # (8)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward_mean_all']:.3f}", t=f"{state['train_time']:.0f}s")
        if _due(state["last_eval"], state["train_time"], ev["every_s"]) or (ev["every_steps"] and state["step"] % ev["every_steps"] == 0):
            last = run_eval()  # (9), off the training clock
        if not finished() and (
            _due(state["last_ckpt"], state["train_time"], t["checkpoint_every_s"])
            or (t["checkpoint_every_steps"] and state["step"] % t["checkpoint_every_steps"] == 0)
        ):
            save()  # (10); the last step's is train.checkpoint_at_end's
    bar.close()
    stopped = dist.any(stop.requested)
    if not stopped and (not last or last["step"] != state["step"]):
        last = run_eval()  # skipped when pre-empted: the grace period is for the checkpoint
    at_end = checkpoint.end_mode(t)  # full: resumable state | weights: the policy only (final/) | false: nothing
    if stopped or at_end == "full":
        save()
    if (t["save_final"] or at_end == "weights") and not stopped:
        backend.save_pretrained(str(run_dir / "final"))
    if not stopped and at_end != "full":
        checkpoint.discard(ckpt_dir, dist)  # a finished run resumes no more: its periodic checkpoints go
    logger.close()
    if hasattr(engine, "close"):
        engine.close()  # after the last collective: closing vLLM tears down its process groups
    stop.after_checkpoint()
    return last
