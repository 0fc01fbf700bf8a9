"""The training loop: GRPO, GRPO-GA, GRPO-PODS and D3S are one loop with different config values.

``train(cfg, run_dir)`` runs one experiment:
  (0) check the config (typed, before any model or dataset loads) and a resume against the run's own record
  (``pods.resume``: exact or refused; a finished run is left as it is), and set the run up (``Run``);
  then, until the step or time budget is spent, each step
  (1) samples this rank's prompts, (2) generates n rollouts per prompt, (3) scores them, (3b) drops groups of equal
  rewards and refills from further prompt batches (``train.group_filter``, ``pods.refill``), (4) down-samples to the
  plan's kept count per group with the named rule, (5) computes advantages on the kept rollouts (D3S: on the full
  group, before (4), and the rule reads them), (5b) applies token-level corrections and selection, (6) updates the
  policy, (7) syncs the weights into the engine, (8) logs, (9) evaluates on the training clock's schedule and
  (10) checkpoints. At the end: a last evaluation, the final checkpoint or weights.
GRPO is rule ``all`` with m = n; GRPO-GA keeps all n and trains them in micro-batches of m with one optimizer
step; PODS keeps m of n (``pods.step`` holds the plan). The training clock (``train_time``) excludes evaluation
and checkpointing, so curves of accuracy against training time compare algorithms fairly.

Several processes (``torchrun --nproc_per_node N -m pods.train hardware=h100x8_zero3 ...``): each rank runs this
same loop on its own ``train.prompts_per_step`` prompts, with its own engine; a prompt group never spans ranks, so
(4)-(5) are per rank (a whole-step rule, ``d3s_cross_step``, gathers the advantages and moves the kept rows so that
every rank trains an equal share: ``pods.step.take_rows``); the backend reduces gradients in (6). ``pods.distributed`` keeps the clock and the stop
decision identical on every rank and reduces what is logged; only rank 0 writes files.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from pods import checkpoint, distributed, resume, tokens
from pods.backends import BACKENDS, build_batch
from pods.config import validate
from pods.d3s import strata
from pods.data import PromptSampler
from pods.engines import ENGINES
from pods.eval.accuracy import answer_prob, canonical_answers, evaluate
from pods.files import atomic
from pods.log import setup
from pods.metrics import MetricsLogger
from pods.models import load_tokenizer, provenance, resolve_model_dir
from pods.progress import bar
from pods.refill import fill_step, generate_groups
from pods.schema import Root
from pods.signals import StopFlag
from pods.step import plan, select_rows, step_lr, take_rows
from pods.tasks import DATASETS, encode_prompts


@dataclass
class LoopState:
    """What the loop carries from step to step (and into a checkpoint)."""

    step: int = 0
    train_time: float = 0.0  # training seconds: evaluation and checkpointing excluded
    last_eval: float = 0.0
    last_ckpt: float = 0.0
    evals: int = 0


def progress_of(state: LoopState, t) -> float:
    """Fraction of the run's horizon used: by optimizer steps and/or training seconds, whichever is further."""
    p = 0.0
    if t.max_steps:
        p = max(p, state.step / t.max_steps)
    if t.time_budget_s:
        p = max(p, state.train_time / t.time_budget_s)
    return min(p, 1.0)


def _reward_metrics(rewards: torch.Tensor, kept: list[float], scores, dist) -> dict:
    """Reward statistics over every rank's groups (``kept``: the rewards of the rows this rank trains), and the mean
    of each reward term."""
    every, kept_r = dist.all_gather(rewards), dist.all_gather(torch.tensor(kept, dtype=rewards.dtype))
    terms = {k: sum(sc.terms[k] for sc in scores) / len(scores) for k in scores[0].terms}
    return {
        "reward_mean_all": every.mean().item(),
        "reward_std_all": every.std().item() if every.numel() > 1 else 0.0,
        "reward_mean_kept": kept_r.mean().item() if kept_r.numel() else 0.0,  # (no row: every group filtered out)
        "reward_std_kept": kept_r.std().item() if kept_r.numel() > 1 else 0.0,
        "zero_var_groups": (every.std(dim=1) == 0).float().mean().item() if rewards.shape[1] > 1 else 1.0,
        "train_accuracy": sum(sc.correct for sc in scores) / len(scores),
        "timeouts": sum(sc.timed_out for sc in scores),
        **{f"reward_{k}": v for k, v in terms.items()},
    }


def rollout_step(
    cfg: Root, engine, backend, prompts, golds, gen, lr, pad_id: int, dist=distributed.SINGLE, progress: float = 0.0, more=None
) -> dict:
    """Steps (2)-(7) for one batch of prompts; returns the step's metrics (timings in seconds; reward
    statistics over every rank's groups). ``progress`` is the training progress in [0, 1]; ``lr`` a number or the LR
    of each optimizer step (``pods.step.step_lr``); ``more()`` the next prompt batch (prompts, golds) for a refill."""
    a, n = cfg.algorithm, cfg.algorithm.n
    first = generate_groups(cfg, engine, prompts, golds)  # (2) generate, (3) score
    # (3b) dynamic sampling (train.group_filter, train.refill_batches; pods.refill): drop zero-variance groups, refill
    groups, every, refill = fill_step(cfg, engine, first, more, dist)
    times = [time.perf_counter()]
    prompts, rewards = groups.prompts, groups.rewards
    step = plan(a, len(prompts), backend.micro_batch_size, progress)
    kept, adv = select_rows(a, rewards, step.keep, generator=gen, dist=dist)  # (4)-(5)
    rollouts = range(len(prompts) * n)  # this rank's rollouts; the rows it trains (a whole-step rule moves them across ranks):
    rows = take_rows(
        a.rule,
        kept,
        dist,
        prompt=[prompts[r // n] for r in rollouts],
        completion=groups.completions,
        logprobs=groups.logprobs,
        adv=adv.tolist(),
        reward=rewards.flatten().tolist(),
        group=[dist.rank * len(prompts) + r // n for r in rollouts],
        truncated=[f == "length" for f in groups.finish],
    )
    metrics = _reward_metrics(every.rewards, rows["reward"], every.scores, dist)
    if cfg.train.log_strata:  # per prompt length: groups, zero-variance groups, kept rollouts (this rank's; pods.d3s)
        metrics["strata"] = strata(prompts, rewards, rows["group"], dist.rank)
    times.append(time.perf_counter())
    if rows["prompt"]:
        batch = build_batch(rows["prompt"], rows["completion"], rows["logprobs"], rows["adv"], pad_id, groups=rows["group"])
        if cfg.train.old_logprobs == "sampler":
            batch.old_logprobs = batch.sampler_logprobs
        if a.mask_truncated:  # DAPO's overlong filtering: a row cut at sampling.max_tokens leaves the loss
            batch.loss_mask[torch.tensor(rows["truncated"], dtype=torch.bool)] = 0.0
        token_metrics = tokens.apply(batch, backend, a, progress, dist)  # (5b) corrections, token selection
        stats = backend.update(batch, lr, micro_batch_size=step.micro_batch if a.grad_accum else None)  # (6)
        counts = {"kept": len(batch), "tokens_trained": int(batch.loss_mask.sum())}
    else:  # every group filtered out on some rank (group_filter): no rank trains this step
        token_metrics, stats, counts = {}, {"optimizer_steps": 0}, {"kept": 0, "tokens_trained": 0}
    times.append(time.perf_counter())
    if engine.needs_sync and rows["prompt"]:
        engine.load_weights(backend.export_weights())  # (7)
    times.append(time.perf_counter())
    spent = {**every.seconds, **dict(zip(("t_select", "t_update", "t_sync"), (b - a_ for a_, b in zip(times, times[1:]))))}
    counts = {"kept": counts["kept"], "tokens": every.tokens, "tokens_trained": counts["tokens_trained"]}
    counts["truncated"] = every.finish.count("length") / len(every.scores)
    return {**stats, **spent, **metrics, **counts, **first.metrics, **token_metrics, **refill}


def _due(last: float, now: float, every: float | None) -> bool:
    return bool(every) and now - last >= every


class Run:
    """One training run's parts and state: built by ``setup`` (step 0), driven by ``train``."""

    def __init__(self, cfg: Root, run_dir: str | Path):
        hw, ds, ev = cfg.hardware, cfg.dataset, cfg.eval
        self.cfg, self.dist = cfg, distributed.init(hw)  # this process's rank (one process: rank 0 of 1)
        self.log = setup(self.dist.rank)  # rank 0 logs (under Hydra into <run_dir>/train.log); the others only warn
        self.run_dir = Path(self.dist.broadcast(str(run_dir)))  # rank 0's (Hydra's timestamped name can differ by a second)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            with atomic(self.run_dir / "config.json") as f:  # replaced whole: a kill leaves the old record or the new one
                f.write(json.dumps({**cfg.model_dump(), "provenance": provenance(cfg.model)}, indent=2))
        if hw.torch_threads:
            torch.set_num_threads(hw.torch_threads)
        torch.manual_seed(cfg.seed + self.dist.rank)  # each rank samples its own rollouts
        task = DATASETS.get(ds.name)(ds)  # data first: a missing file fails before the model loads
        self.model_dir = resolve_model_dir(cfg.model)
        self.tok = load_tokenizer(self.model_dir)
        self.train_ids, train_ex, self.dropped = encode_prompts(task.train, self.tok, ds.max_prompt_length)
        test_ids, test_ex, _ = encode_prompts(task.test[: ev.max_examples], self.tok, ds.max_prompt_length)
        self.golds = [ex.gold for ex in train_ex]
        self.backend = BACKENDS.get(hw.backend)(self.model_dir, cfg)
        self.engine = ENGINES.get(cfg.rollout.name)(self.model_dir, self.tok, cfg.rollout, policy=self.backend.policy)
        np.random.seed(cfg.seed + self.dist.rank)  # vLLM's GPU runner seeds each unseeded request from NumPy's global RNG
        t = cfg.train
        self.sampler = PromptSampler(len(self.train_ids), t.prompts_per_step, cfg.seed, self.dist.rank, self.dist.world, t.group_repeats)
        self.gen = torch.Generator().manual_seed(cfg.seed + self.dist.rank)  # the random down-sampling rule's stream
        self.state, self.ckpt_dir = LoopState(), self.run_dir / "checkpoints"
        lockstep = self.backend.collective_forward and not self.engine.needs_sync  # generating with the ZeRO-3 module
        self.test_prompts = len(test_ids)
        self.test_ids, self.test_golds = self.dist.shard(test_ids, [ex.gold for ex in test_ex], lockstep=lockstep)
        self.canonical = (test_ids, canonical_answers(ds.name, test_ex))  # answer_prob: every rank, all prompts (one forward each)

    def resume(self) -> None:
        """``train.resume``: restore the latest (``auto``) or the named checkpoint, if there is one."""
        resume = self.cfg.train.resume
        path = checkpoint.latest(self.ckpt_dir) if resume == "auto" else Path(resume) if resume else None
        if path is not None:
            loop, extra = checkpoint.load(path, self.backend, self.sampler, self.dist)
            self.state = LoopState(**loop)
            self.gen.set_state(extra["select"])
            if self.dist.is_main:
                self.log.info(f"resumed from {path} at step {self.state.step}")

    def open_logger(self) -> None:
        self.logger = MetricsLogger(
            self.run_dir, self.cfg, enabled=self.dist.is_main, resume_step=self.state.step if self.cfg.train.resume else None
        )
        if self.state.step == 0:
            setup_row = {"model_dir": str(self.model_dir), "train_prompts": len(self.train_ids), "dropped_prompts": self.dropped}
            self.logger.log({"kind": "setup", "step": 0, **setup_row, "test_prompts": self.test_prompts, "world_size": self.dist.world})

    def prompts_of(self, idx: list[int]) -> tuple[list, list]:
        return [self.train_ids[i] for i in idx], [self.golds[i] for i in idx]

    def step(self) -> dict:
        """Steps (1)-(8): this rank's prompts, the rollout step, the clock, the log row."""
        clock, st, cfg = time.perf_counter(), self.state, self.cfg
        prompts, golds = self.prompts_of(self.sampler.next())  # (1)
        p = progress_of(st, cfg.train)
        p_next = progress_of(LoopState(step=st.step + 1, train_time=st.train_time), cfg.train)
        lr = step_lr(cfg.optim, p, p_next)  # the LR of each optimizer step of this rollout step (mini-batches)
        more = lambda: self.prompts_of(self.sampler.next())  # noqa: E731 - a refill's next batch (pods.refill)
        row = rollout_step(cfg, self.engine, self.backend, prompts, golds, self.gen, lr, self.tok.pad_token_id, self.dist, p, more)
        row = self.dist.reduce_metrics(row)
        st.step += 1
        st.train_time += self.dist.max(time.perf_counter() - clock)  # the slowest rank's time: one clock for all
        self.logger.log({"kind": "train", "step": st.step, "train_time": st.train_time, **row})  # (8)
        return row

    def evaluate(self) -> dict:
        """(9), off the training clock: every rank scores its share of the test prompts."""
        st, ev = self.state, self.cfg.eval
        res = evaluate(
            self.engine,
            self.test_ids,
            self.test_golds,
            ev,
            self.cfg.dataset,
            ev.seed + st.evals,
            on_samples=self.logger.completion_sink(self.tok),
        )
        if self.canonical[1] is not None:
            res["answer_prob"] = answer_prob(self.backend, self.tok, *self.canonical)["answer_prob"]
        row = {"kind": "eval", "step": st.step, "train_time": st.train_time, **self.dist.reduce_eval(res)}
        st.evals += 1
        st.last_eval = st.train_time
        self.logger.log(row)
        return row

    def save(self) -> None:
        """(10): the resumable state of every rank, newest ``train.keep_checkpoints`` kept."""
        st = self.state
        path = self.ckpt_dir / f"step_{st.step:06d}.pt"
        checkpoint.save(
            path, asdict(st), self.backend, self.sampler, {"select": self.gen.get_state()}, self.dist, keep=self.cfg.train.keep_checkpoints
        )
        st.last_ckpt = st.train_time

    def finished(self) -> bool:
        t, st = self.cfg.train, self.state
        return bool((t.max_steps and st.step >= t.max_steps) or (t.time_budget_s and st.train_time >= t.time_budget_s))

    def eval_due(self) -> bool:
        ev, st = self.cfg.eval, self.state
        return _due(st.last_eval, st.train_time, ev.every_s) or bool(ev.every_steps and st.step % ev.every_steps == 0)

    def checkpoint_due(self) -> bool:
        t, st = self.cfg.train, self.state
        every = _due(st.last_ckpt, st.train_time, t.checkpoint_every_s) or bool(
            t.checkpoint_every_steps and st.step % t.checkpoint_every_steps == 0
        )
        return every and not self.finished()  # the last step's checkpoint is train.checkpoint_at_end's

    def finish(self, last: dict, stopped: bool) -> dict:
        """The end: a last evaluation (skipped when pre-empted: the grace period is for the checkpoint), then
        ``train.checkpoint_at_end``: full = resumable state | weights = the policy only (final/) | false = nothing."""
        t = self.cfg.train
        if not stopped and (not last or last["step"] != self.state.step):
            last = self.evaluate()
        at_end = checkpoint.end_mode(t)
        if stopped or at_end == "full":
            self.save()
        if (t.save_final or at_end == "weights" or self.cfg.eval.suite) and not stopped:  # the suite reads final/
            self.backend.save_final(str(self.run_dir / "final"), self.tok)  # weights, tokenizer, an adapter's base
        if not stopped and at_end != "full":
            checkpoint.discard(self.ckpt_dir, self.dist)  # a finished run resumes no more: its periodic checkpoints go
        self.logger.close()
        if hasattr(self.engine, "close"):
            self.engine.close()  # after the last collective: closing vLLM tears down its process groups
        return last


def train(cfg: dict | Root, run_dir: str | Path) -> dict:
    """Run one experiment; returns the last eval row. Writes config.json, metrics.jsonl, checkpoints/."""
    cfg = validate(cfg)  # (0) typed and checked before any model or dataset is loaded
    end = resume.check(cfg, run_dir)  # a resume with other settings: refused; a finished run: nothing to do
    if end is not None:
        setup().info(resume.finished_line(run_dir, end))
        return end
    run = Run(cfg, run_dir)
    run.resume()
    if run.engine.needs_sync:  # the engine serves the trainer's policy (a 4-bit base: its NF4 values), or the resumed one
        run.engine.load_weights(run.backend.export_weights())
    run.open_logger()
    stop = StopFlag().install()  # (SLURM pre-emption) -> checkpoint at the next step boundary, then exit
    a, ev = run.cfg.algorithm, run.cfg.eval
    last = run.evaluate() if ev.at_start and run.state.step == 0 else {}
    progress = bar(total=run.cfg.train.max_steps, initial=run.state.step, desc=f"{a.name} n={a.n} m={a.m}", disable=not run.dist.is_main)
    while not run.finished() and not run.dist.any(stop.requested):  # a signal to one rank stops them all
        row = run.step()  # (1)-(8)
        progress.set_postfix(reward=f"{row['reward_mean_all']:.3f}", t=f"{run.state.train_time:.0f}s", refresh=False)
        progress.update(1)
        if run.eval_due():
            last = run.evaluate()  # (9)
        if run.checkpoint_due():
            run.save()  # (10)
    progress.close()
    last = run.finish(last, stopped=run.dist.any(stop.requested))
    stop.after_checkpoint()
    return last
