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
``train.max_staleness: k >= 1``: steps (1)-(5) run ahead in a producer thread (``pods.producer``, docs/async.md) while
(5b)-(7) update on the batch generated k policy versions before; a checkpoint drains it. 0 (default): no thread.

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
from pods.data import PromptSampler
from pods.engines import ENGINES
from pods.eval.accuracy import answer_prob, canonical_answers, evaluate
from pods.files import atomic
from pods.log import setup
from pods.metrics import MetricsLogger
from pods.models import load_tokenizer, provenance, resolve_model_dir
from pods.producer import Producer, Ready, prepare
from pods.progress import bar
from pods.schema import Root
from pods.signals import StopFlag
from pods.step import step_lr
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


def rollout_step(
    cfg: Root, engine, backend, prompts, golds, gen, lr, pad_id: int, dist=distributed.SINGLE, progress: float = 0.0, more=None
) -> dict:
    """Steps (2)-(7) for one batch of prompts; returns the step's metrics (timings in seconds; reward
    statistics over every rank's groups). ``progress`` is the training progress in [0, 1]; ``lr`` a number or the LR
    of each optimizer step (``pods.step.step_lr``); ``more()`` the next prompt batch (prompts, golds) for a refill."""
    ready = prepare(cfg, engine, backend.micro_batch_size, prompts, golds, gen, dist, progress, more)  # (2)-(5)
    return learn(cfg, engine, backend, ready, lr, pad_id, dist, progress)


def learn(cfg: Root, engine, backend, ready: Ready, lr, pad_id: int, dist, progress: float, version: int | None = None) -> dict:
    """Steps (5b)-(7) on a prepared batch. ``version``: the trainer's policy version before this update (the
    asynchronous loop: each row's staleness is ``version`` minus its own; rows over ``train.max_staleness`` leave the
    loss); None: the synchronous loop (staleness 0). ``engine``: pushed the new weights when it needs a sync (None:
    the producer pushes)."""
    a, rows = cfg.algorithm, ready.rows
    stale = [0 if version is None else version - v for v in rows["version"]]
    t0 = time.perf_counter()
    if rows["prompt"]:
        batch = build_batch(rows["prompt"], rows["completion"], rows["logprobs"], rows["adv"], pad_id, groups=rows["group"])
        batch.staleness = torch.tensor(stale, dtype=torch.long)
        if cfg.train.old_logprobs == "sampler":
            batch.old_logprobs = batch.sampler_logprobs
        if a.mask_truncated:  # DAPO's overlong filtering: a row cut at sampling.max_tokens leaves the loss
            batch.loss_mask[torch.tensor(rows["truncated"], dtype=torch.bool)] = 0.0
        batch.loss_mask[batch.staleness > cfg.train.max_staleness] = 0.0  # admission (none, by the producer's schedule)
        token_metrics = tokens.apply(batch, backend, a, progress, dist)  # (5b) corrections, token selection
        stats = backend.update(batch, lr, micro_batch_size=ready.micro_batch if a.grad_accum else None)  # (6)
        counts = {"kept": len(batch), "tokens_trained": int(batch.loss_mask.sum())}
    else:  # every group filtered out on some rank (group_filter): no rank trains this step
        token_metrics, stats, counts = {}, {"optimizer_steps": 0}, {"kept": 0, "tokens_trained": 0}
    t1 = time.perf_counter()
    if engine is not None and engine.needs_sync and rows["prompt"]:
        engine.load_weights(backend.export_weights())  # (7)
    m = ready.metrics
    spent = {"t_generate": m["t_generate"], "t_score": m["t_score"], "t_select": m["t_select"], "t_update": t1 - t0}
    spent["t_sync"] = time.perf_counter() - t1
    counts = {"kept": counts["kept"], "tokens": m["tokens"], "tokens_trained": counts["tokens_trained"], "truncated": m["truncated"]}
    rewards = {k: v for k, v in m.items() if k not in spent and k not in counts}
    staleness = {"staleness_max": max(stale, default=0), "staleness_mean": sum(stale) / len(stale) if stale else 0.0}
    return {**stats, **spent, **rewards, **counts, **ready.engine, **token_metrics, **ready.refill, **staleness}


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
        self.producer: Producer | None = None  # train.max_staleness >= 1: started by ``start_producer``
        self.next_batch = 1  # the producer's next batch (a checkpoint's, on resume)
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
            self.next_batch = int(extra.get("producer", {}).get("next_batch", self.state.step + 1))
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

    def start_producer(self) -> None:
        """``train.max_staleness >= 1``: the producer thread, serving the current (maybe resumed) policy."""
        if self.cfg.train.max_staleness:
            self.producer = Producer(self, version=self.state.step, next_batch=self.next_batch)

    def step(self) -> dict:
        """Steps (1)-(8): this rank's prompts, the rollout step, the clock, the log row."""
        clock, st, cfg = time.perf_counter(), self.state, self.cfg
        p = progress_of(st, cfg.train)
        p_next = progress_of(LoopState(step=st.step + 1, train_time=st.train_time), cfg.train)
        lr = step_lr(cfg.optim, p, p_next)  # the LR of each optimizer step of this rollout step (mini-batches)
        if self.producer is None:
            prompts, golds = self.prompts_of(self.sampler.next())  # (1)
            more = lambda: self.prompts_of(self.sampler.next())  # noqa: E731 - a refill's next batch (pods.refill)
            row = rollout_step(cfg, self.engine, self.backend, prompts, golds, self.gen, lr, self.tok.pad_token_id, self.dist, p, more)
        else:
            row = self.overlapped_step(p, lr)
        row = self.dist.reduce_metrics(row)
        st.step += 1
        st.train_time += self.dist.max(time.perf_counter() - clock)  # the slowest rank's time: one clock for all
        self.logger.log({"kind": "train", "step": st.step, "train_time": st.train_time, **row})  # (8)
        return row

    def overlapped_step(self, p: float, lr) -> dict:
        """Steps (1)-(7) with the producer (``pods.producer``): batch u was generated while update u - 1 ran, and batch
        u + k is generated while update u runs; then the producer's engine serves version u. ``t_wait``: the seconds the
        trainer waited for the producer (the rest of t_generate, t_score and t_select overlapped the update)."""
        st, prod = self.state, self.producer
        prod.top_up(st, lambda b: progress_of(LoopState(step=b - 1, train_time=st.train_time), self.cfg.train))
        t0 = time.perf_counter()
        ready = prod.take(st.step + 1)
        waited = time.perf_counter() - t0
        row = learn(self.cfg, None, self.backend, ready, lr, self.tok.pad_token_id, self.dist, p, version=st.step)
        t1 = time.perf_counter()
        idle = prod.settle(st.step + 1)  # (7): once the producer is idle
        row["t_sync"] = time.perf_counter() - t1 - idle
        return {**row, "t_wait": waited + idle}

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
        st, extra = self.state, {"select": self.gen.get_state()}
        if self.producer is not None:  # drained: the next batch is generated from the weights saved here
            self.producer.rewind()
            extra = {**extra, "select": self.gen.get_state(), "producer": {"next_batch": self.producer.next, "version": st.step}}
        path = self.ckpt_dir / f"step_{st.step:06d}.pt"
        checkpoint.save(path, asdict(st), self.backend, self.sampler, extra, self.dist, keep=self.cfg.train.keep_checkpoints)
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
        if self.producer is not None:
            self.producer.close()
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
    run.start_producer()  # train.max_staleness >= 1
    run.open_logger()
    stop = StopFlag().install()  # (SLURM pre-emption) -> checkpoint at the next step boundary, then exit
    a, ev = run.cfg.algorithm, run.cfg.eval
    last = run.evaluate() if ev.at_start and run.state.step == 0 else {}
    progress = bar(total=run.cfg.train.max_steps, initial=run.state.step, desc=f"{a.name} n={a.n} m={a.m}", disable=not run.dist.is_main)
    try:  # the bar is closed before an error's line is printed (pods.train): that line stays the last one
        while not run.finished() and not run.dist.any(stop.requested):  # a signal to one rank stops them all
            row = run.step()  # (1)-(8)
            progress.set_postfix(reward=f"{row['reward_mean_all']:.3f}", t=f"{run.state.train_time:.0f}s", refresh=False)
            progress.update(1)
            if run.eval_due():
                last = run.evaluate()  # (9)
            if run.checkpoint_due():
                run.save()  # (10)
    finally:
        progress.close()
    last = run.finish(last, stopped=run.dist.any(stop.requested))
    stop.after_checkpoint()
    return last
