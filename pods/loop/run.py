"""``Run``: one training run's parts and state, built by its step (0), and ``train``, which drives it: steps (1)-(7)
through ``pods.loop.rollouts`` and ``pods.loop.learn`` (or the producer thread), then (8) log, (9) evaluate,
(10) checkpoint, and the end (the package's docstring numbers the steps)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from pods import checkpoint, distributed, resume
from pods.backends import BACKENDS
from pods.data import PromptSampler
from pods.engines import ENGINES
from pods.engines.base import remember
from pods.engines.frozen import Frozen
from pods.errors import ConfigError
from pods.eval.accuracy import answer_prob, canonical_answers, evaluate
from pods.files import atomic
from pods.log import setup
from pods.loop.learn import Trainer, learn, step_row
from pods.loop.producer import Producer
from pods.loop.rollouts import Generation, Source, prepare
from pods.metrics import MetricsLogger
from pods.models import load_tokenizer, provenance, resolve_model_dir
from pods.plan import step_lr
from pods.progress import bar
from pods.schema import Root
from pods.signals import StopFlag
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


def rollout_step(g: Generation, t: Trainer, source: Source, lr, progress: float = 0.0) -> dict:
    """Steps (1)-(7) for one batch of ``source``'s prompts; returns the step's metrics (timings in seconds; reward
    statistics over every rank's groups). ``progress`` is the training progress in [0, 1]; ``lr`` a number or the LR
    of each optimizer step (``pods.plan.step_lr``)."""
    ready = prepare(g, source, progress)  # (1)-(5)
    return step_row(ready.produced, learn(t, ready, lr, progress))  # (5b)-(7)


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
        if hw.torch_threads:
            torch.set_num_threads(hw.torch_threads)
        torch.manual_seed(cfg.seed + self.dist.rank)  # each rank samples its own rollouts
        task = DATASETS.get(ds.name)(ds)  # data first: a missing file fails before the model loads (and before the record)
        if self.dist.is_main:
            with atomic(self.run_dir / "config.json") as f:  # replaced whole: a kill leaves the old record or the new one
                f.write(json.dumps({**cfg.model_dump(), "provenance": provenance(cfg.model)}, indent=2))
        self.model_dir = resolve_model_dir(cfg.model)
        self.tok = load_tokenizer(self.model_dir)
        chat = cfg.model.chat_template_kwargs  # Qwen3's enable_thinking and the like
        self.train_ids, train_ex, self.dropped = encode_prompts(task.train, self.tok, ds.max_prompt_length, chat)
        test_ids, test_ex, _ = encode_prompts(task.test[: ev.max_examples], self.tok, ds.max_prompt_length, chat)
        self.backend = BACKENDS.get(hw.backend)(self.model_dir, cfg)
        os.environ["PODS_SERVER_LOGS"] = str(self.run_dir / "vllm_server")  # a launched vllm_server logs in the run
        self.engine = ENGINES.get(cfg.rollout.name)(self.model_dir, self.tok, cfg.rollout, policy=self.backend.policy)
        remember(engine=self.engine, backend=self.backend, policy=self.backend.policy)  # gone before the suite's process
        np.random.seed(cfg.seed + self.dist.rank)  # vLLM's GPU runner seeds each unseeded request from NumPy's global RNG
        t = cfg.train
        sampler = PromptSampler(len(self.train_ids), t.prompts_per_step, cfg.seed, self.dist.rank, self.dist.world, t.group_repeats)
        gen = torch.Generator().manual_seed(cfg.seed + self.dist.rank)  # the random down-sampling rule's stream
        self.source = Source(sampler, self.train_ids, [ex.gold for ex in train_ex], gen)
        self.generation = Generation(cfg, self.engine, self.dist, self.backend.micro_batch_size)
        self.trainer = Trainer(cfg, self.backend, self.tok.pad_token_id, self.dist, self.engine)
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
            loop, extra = checkpoint.load(path, self.backend, self.source.sampler, self.dist)
            self.state = LoopState(**loop)
            self.source.gen.set_state(extra["select"])
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

    def start_producer(self) -> None:
        """``train.max_staleness >= 1``: the producer thread, serving the current (maybe resumed) policy from an engine
        of its own (a frozen copy of the policy when the trainer's engine samples with the live module)."""
        if not self.cfg.train.max_staleness:
            return
        own = self.engine.needs_sync
        engine = self.engine if own else Frozen(self.engine, self.model_dir, self.tok)  # (a copy of the resumed policy)
        remember(producer_engine=engine)
        weights = self.backend.export_weights if own else lambda: self.backend.policy.state_dict().items()
        dist = self.dist.fork(self.cfg.hardware.dist_timeout_s)  # the producer's collectives: a group of their own
        gen = Generation(self.cfg, engine, dist, self.backend.micro_batch_size)
        self.producer = Producer(gen, self.source, weights, self.dist, version=self.state.step, next_batch=self.next_batch)
        self.trainer = replace(self.trainer, engine=None)  # the producer pushes the weights into its engine

    def step(self) -> dict:
        """Steps (1)-(8): this rank's prompts, the rollout step, the clock, the log row."""
        clock, st, cfg = time.perf_counter(), self.state, self.cfg
        p = progress_of(st, cfg.train)
        p_next = progress_of(LoopState(step=st.step + 1, train_time=st.train_time), cfg.train)
        lr = step_lr(cfg.optim, p, p_next)  # the LR of each optimizer step of this rollout step (mini-batches)
        sync = self.producer is None
        row = rollout_step(self.generation, self.trainer, self.source, lr, p) if sync else self.overlapped_step(p, lr)  # (1)-(7)
        row = self.dist.reduce_metrics(row)
        st.step += 1
        st.train_time += self.dist.max(time.perf_counter() - clock)  # the slowest rank's time: one clock for all
        self.logger.log({"kind": "train", "step": st.step, "train_time": st.train_time, **row})  # (8)
        return row

    def overlapped_step(self, p: float, lr) -> dict:
        """Steps (1)-(7) with the producer (``pods.loop.producer``): batch u was generated while update u - 1 ran, and batch
        u + k is generated while update u runs; then the producer's engine serves version u. ``t_wait``: the seconds the
        trainer waited for the producer (the rest of t_generate, t_score and t_select overlapped the update)."""
        st, prod = self.state, self.producer
        prod.top_up(st.step, lambda b: progress_of(LoopState(step=b - 1, train_time=st.train_time), self.cfg.train))
        t0 = time.perf_counter()
        ready = prod.take(st.step + 1)
        waited = time.perf_counter() - t0
        learned = learn(self.trainer, ready, lr, p, version=st.step)
        t1 = time.perf_counter()
        idle = prod.settle(st.step + 1)  # (7): once the producer is idle
        learned.t_sync = time.perf_counter() - t1 - idle
        return step_row(ready.produced, learned, t_wait=waited + idle)

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
        st, extra = self.state, {}
        if self.producer is not None:  # drained: the next batch is generated from the weights saved here
            extra["producer"] = {"next_batch": self.producer.rewind(), "version": st.step}
        extra = {"select": self.source.gen.get_state(), **extra}
        path = self.ckpt_dir / f"step_{st.step:06d}.pt"
        checkpoint.save(path, asdict(st), self.backend, self.source.sampler, extra, self.dist, keep=self.cfg.train.keep_checkpoints)
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
        self.engine.close()  # after the last collective: closing vLLM tears down its process groups
        return last


def train(cfg: Root, run_dir: str | Path) -> dict:
    """Run one experiment from a validated config (``pods.config.validate``: typed and checked before any model or
    dataset is loaded); returns the last eval row (with ``stopped``, the signal's name, when a stop request
    ended it early: ``pods.signals``). Writes config.json, metrics.jsonl, checkpoints/."""
    if not isinstance(cfg, Root):
        raise ConfigError(f"pods.loop.train takes a validated config, not a {type(cfg).__name__}: pass pods.config.validate(cfg)")
    end = resume.check(cfg, run_dir)  # (0)  # a resume with other settings: refused; a finished run: nothing to do
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
    stopped = run.dist.any(stop.requested)
    last = run.finish(last, stopped=stopped)
    stop.after_checkpoint()
    return {**last, "stopped": stop.by or "another rank's stop request"} if stopped else last
