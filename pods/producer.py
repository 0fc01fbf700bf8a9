"""Steps (2)-(5) of the loop as one job, and the producer that runs them ahead of the trainer (``train.max_staleness``).

``prepare`` is what crosses from rollouts to the update: it generates, scores, filters and refills
(``pods.refill``), down-samples and computes advantages, and returns the rows this rank trains (``Ready``). The
synchronous loop (``max_staleness: 0``, the default) calls it inline and starts no thread.

With ``max_staleness: k >= 1`` a ``Producer`` runs ``prepare`` in one background thread while the trainer updates
(docs/async.md). Batch b (the batch of update b, counted from 1) is generated with policy version max(0, b - 1 - k)
exactly, whatever the threads' speeds: the trainer submits the jobs, and pushes version u into the producer's engine
only once the producer is idle, after update u. So the row staleness (the trainer's version before update b, b - 1,
minus the row's version) is at most k, every run of a config computes the same numbers, and the producer owns, while
a job runs, the prompt sampler, the selection generator and the global torch/NumPy RNGs the engine samples from; the
trainer draws from no RNG (a LoRA dropout would: refused by ``pods.config``) and evaluates with the RNGs forked.

A checkpoint drains the producer (``rewind``): the batches generated ahead are dropped, and the sampler, the
selection generator and the global RNGs go back to where the oldest of them started, so the next batch is generated
from the saved weights, in an uninterrupted run and in a run resumed from that checkpoint alike.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from pods import checkpoint
from pods.d3s import strata
from pods.engines.base import Engine
from pods.refill import fill_step, generate_groups
from pods.schema import Root
from pods.step import plan, select_rows, take_rows


@dataclass
class Ready:
    """One prepared batch: the rows this rank trains (per row: prompt, completion, logprobs, adv, reward, group,
    truncated, version) and the step's metrics so far (reward statistics, counts, t_generate/t_score/t_select)."""

    rows: dict[str, list]
    micro_batch: int  # the plan's micro-batch (GRPO-GA's accumulation)
    metrics: dict = field(default_factory=dict)
    engine: dict = field(default_factory=dict)  # the engine's metrics (of the step's first batch)
    refill: dict = field(default_factory=dict)  # the refill's (pods.refill)


def reward_metrics(rewards: torch.Tensor, kept: list[float], scores, dist) -> dict:
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


def prepare(cfg: Root, engine, micro_batch_size, prompts, golds, gen, dist, progress: float, more) -> Ready:
    """Steps (2)-(5) for one batch of prompts: generate, score, filter/refill, down-sample, advantages. ``progress``:
    the training progress in [0, 1] (the plan's ramps); ``more()``: the next prompt batch (prompts, golds)."""
    a, n = cfg.algorithm, cfg.algorithm.n
    first = generate_groups(cfg, engine, prompts, golds)  # (2) generate, (3) score
    groups, every, refill = fill_step(cfg, engine, first, more, dist)  # (3b) train.group_filter (pods.refill)
    t0 = time.perf_counter()
    prompts, rewards = groups.prompts, groups.rewards
    step = plan(a, len(prompts), micro_batch_size, progress)
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
        version=groups.versions,
    )
    metrics = reward_metrics(every.rewards, rows["reward"], every.scores, dist)
    if cfg.train.log_strata:  # per prompt length: groups, zero-variance groups, kept rollouts (this rank's; pods.d3s)
        metrics["strata"] = strata(prompts, rewards, rows["group"], dist.rank)
    seconds = {**every.seconds, "t_select": time.perf_counter() - t0}
    counts = {"tokens": every.tokens, "truncated": every.finish.count("length") / len(every.scores)}
    return Ready(rows, step.micro_batch, {**seconds, **metrics, **counts}, first.metrics, refill)


class Frozen(Engine):
    """A policy engine (HF, sparse HF) on its own copy of the policy, so that the producer generates while the trainer
    updates the live module. ``load_weights`` takes the live module's ``state_dict`` items (the copy's own names)."""

    needs_sync = True

    def __init__(self, engine, model_dir, tokenizer):
        self.copy = copy.deepcopy(engine.policy).requires_grad_(False)
        self.inner = type(engine)(model_dir, tokenizer, engine.cfg, policy=self.copy)

    def generate(self, prompts, n, sampling, progress=False):
        return self.inner.generate(prompts, n, sampling, progress)

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        own = self.copy.state_dict()
        for name, t in named_tensors:
            own[name].copy_(t)
        self.version += 1


class Producer:
    """One background thread that runs ``prepare`` for the next batches, in order (module docstring).

    The trainer calls, per step u (its version before the update: u - 1): ``top_up`` (submit batches up to u + k),
    ``take(u)`` (wait for batch u), then after the update ``settle(u)`` (wait until the producer is idle, push version
    u); and ``rewind`` before a checkpoint.

    Several ranks: each runs its own producer, and every collective of ``prepare`` (the refill's agreement, a
    whole-step rule's gather, the reward statistics) runs on ``self.dist``, a process group of the producers' own
    (``Dist.fork``), while the trainer thread's (gradients, clock, logged rows, the weight export) stay on the default
    group. Each rank's producer runs the same jobs in the same order, so its collectives pair up across ranks."""

    def __init__(self, run, version: int, next_batch: int):
        cfg, engine = run.cfg, run.engine
        self.run, self.k = run, cfg.train.max_staleness
        self.engine = engine if engine.needs_sync else Frozen(engine, run.model_dir, run.tok)  # (a copy of the resumed policy)
        self.weights = run.backend.export_weights if engine.needs_sync else lambda: run.backend.policy.state_dict().items()
        self.dist = run.dist.fork(cfg.hardware.dist_timeout_s)  # the producer's collectives: a group of their own
        self.dist.barrier()  # every rank's start push is done (vllm_server: the other ranks saw its label) ...
        self.engine.version, self.next = version, next_batch  # ... before rank 0 relabels the servers with ``version``
        self.dist.barrier()  # ... and that is done before any rank's producer generates
        self.pending: deque[tuple[int, Future]] = deque()
        threads = cfg.hardware.torch_threads or torch.get_num_threads()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="pods-producer", initializer=torch.set_num_threads, initargs=(threads,))

    @property
    def version(self) -> int:
        return self.engine.version

    def top_up(self, state, progress_at) -> None:
        """Submit the batches up to ``state.step + 1 + k`` (none past ``train.max_steps``); ``progress_at(b)``: the
        training progress the plan of batch b reads."""
        last = self.run.cfg.train.max_steps
        while self.next <= state.step + 1 + self.k and not (last and self.next > last):
            assert self.version >= self.next - 1 - self.k, (self.version, self.next)  # the admission bound, by construction
            self.pending.append((self.next, self.pool.submit(self._job, progress_at(self.next))))
            self.next += 1

    def _job(self, progress: float) -> tuple[Ready, dict]:
        run, start = self.run, self.state()  # where this batch starts: what a rewind restores
        more = lambda: run.prompts_of(run.sampler.next())  # noqa: E731 - a refill's next batch (pods.refill)
        prompts, golds = more()  # (1)
        ready = prepare(run.cfg, self.engine, run.backend.micro_batch_size, prompts, golds, run.gen, self.dist, progress, more)
        return ready, start

    def take(self, batch: int) -> Ready:
        """Batch ``batch``, once generated (an error in the producer is raised here)."""
        index, future = self.pending.popleft()
        assert index == batch, (index, batch)
        return future.result()[0]

    def settle(self, version: int) -> float:
        """Wait until every submitted batch is generated, then serve policy ``version``; returns the seconds waited."""
        t0 = time.perf_counter()
        for _, future in self.pending:
            future.result()
        self.run.dist.barrier()  # every rank's producer is idle before rank 0 pushes into servers they all share
        waited = time.perf_counter() - t0
        self.engine.load_weights(self.weights())
        self.engine.version = version
        return waited

    def state(self) -> dict:
        """What the producer owns between jobs: the prompt sampler, the selection generator, the global RNGs."""
        return {"sampler": self.run.sampler.state_dict(), "select": self.run.gen.get_state(), "rng": checkpoint.rng_state()}

    def rewind(self) -> None:
        """Drop the batches generated ahead (the producer is idle: after ``settle``) and restore the state where the
        oldest of them started; the next batch is the trainer's next step's, generated from the current weights."""
        if not self.pending:
            return
        index, future = self.pending[0]
        start = future.result()[1]
        self.pending.clear()
        self.run.sampler.load_state_dict(start["sampler"])
        self.run.gen.set_state(start["select"])
        checkpoint.set_rng_state(start["rng"])
        self.next = index

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
