"""Steps (1)-(5) of the loop, for every run: a batch of prompts, n rollouts each, their scores, dynamic sampling
(drop groups whose rewards do not vary and refill), the down-sampling rule and the advantages. ``prepare`` runs them
and returns ``Ready``: the ``Rows`` this rank trains and what these steps measured (``Produced``). The synchronous
loop calls it inline; with ``train.max_staleness >= 1`` the producer thread does (``pods.loop.producer``).

Dynamic sampling (DAPO, Yu et al., arXiv 2503.14476, section 3.2; docs/knobs.md), ``train.group_filter``:

- ``none`` (the default): the first batch is the step;
- ``nonzero_std``: a group whose n rewards are all equal (every answer right, or every one wrong) has zero advantage
  under a group-normalised estimator and is dropped before down-sampling. While a rank has fewer kept groups than
  ``train.prompts_per_step`` and fewer than ``train.refill_batches`` extra batches were generated, every rank
  generates one more batch of ``prompts_per_step`` prompts from the prompt sampler (every rank: the sampler walks one
  global order, and a ZeRO-3 engine generates in lockstep). Each rank then keeps its first kept groups, as many as
  the rank with the fewest has (at most ``prompts_per_step``), so that every rank trains as many rows in as many
  micro-batches. Extra kept groups are discarded, as DAPO does. A step left with no group trains nothing.

Refills count on the training clock (the x-axis of DAPO's curves) and change only the prompt sampler's position and
the RNG states, which the checkpoint holds: a resumed run continues exactly. Logged: ``gen_batches``, and over all
ranks ``groups_filtered`` (dropped) and ``groups_refilled`` (trained groups from refill batches).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from pods import checkpoint, downsample
from pods.advantages import ADVANTAGES
from pods.d3s import strata
from pods.distributed import Dist
from pods.engines import Engine, Sampling
from pods.plan import plan
from pods.schema import Root
from pods.tasks import score_batch
from pods.tasks.base import overlong_penalty


@dataclass(frozen=True)
class Generation:
    """What steps (2)-(5) work with: the config, the engine that samples, the ranks the step's collectives run on
    (the producer's own group under ``train.max_staleness >= 1``) and the backend's micro-batch (the plan's)."""

    cfg: Root
    engine: Engine
    dist: Dist
    micro_batch_size: int


@dataclass
class Source:
    """Where the steps' prompts come from, and the random state steps (1)-(5) draw from: the prompt sampler over the
    training prompts (ids and gold answers) and the down-sampling rule's generator (``random``), beside the global
    RNGs the engine samples from. Whoever runs (1)-(5) owns it (the producer thread, when there is one)."""

    sampler: object  # pods.data.PromptSampler (next, state_dict, load_state_dict)
    prompt_ids: list[list[int]]
    golds: list[str]
    gen: torch.Generator

    def next(self) -> tuple[list[list[int]], list[str]]:
        """(1) The next batch: its prompts' ids and gold answers."""
        idx = self.sampler.next()
        return [self.prompt_ids[i] for i in idx], [self.golds[i] for i in idx]

    def state(self) -> dict:
        """Everything (1)-(5) draw from: the sampler's position, the selection generator, the global RNGs."""
        return {"sampler": self.sampler.state_dict(), "select": self.gen.get_state(), "rng": checkpoint.rng_state()}

    def restore(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.gen.set_state(state["select"])
        checkpoint.set_rng_state(state["rng"])

    @staticmethod
    def of_batch(prompt_ids: list[list[int]], golds: list[str], gen: torch.Generator) -> Source:
        """A source that gives this one batch at every draw (a benchmark's step on chosen prompts)."""
        return Source(_Same(len(prompt_ids)), prompt_ids, golds, gen)


@dataclass
class _Same:
    """A prompt sampler that returns every prompt, in order, at every draw (no state to save)."""

    size: int

    def next(self) -> list[int]:
        return list(range(self.size))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        return None


@dataclass
class Groups:
    """G prompt groups of n scored rollouts each (row r of the rollouts belongs to group r // n)."""

    n: int
    prompts: list[list[int]]  # [G] prompt ids
    golds: list[str]  # [G]
    completions: list[list[int]]  # [G * n] completion ids
    logprobs: list[list[float]]  # [G * n] the sampler's log-probs
    finish: list[str]  # [G * n] "stop" | "length"
    scores: list  # [G * n] pods.tasks.base.Score
    versions: list[int]  # [G * n] the oldest policy version among each rollout's tokens
    tokens: int = 0  # completion tokens generated
    metrics: dict = field(default_factory=dict)  # the engine's metrics (of the step's first batch)
    seconds: dict = field(default_factory=dict)  # t_generate, t_score: this batch's (joined: summed)

    PER_ROLLOUT = ("completions", "logprobs", "finish", "scores", "versions")

    @property
    def rewards(self) -> Tensor:
        """[G, n] float64."""
        return torch.tensor([sc.reward for sc in self.scores], dtype=torch.float64).view(len(self.prompts), self.n)

    def take(self, groups: list[int]) -> Groups:
        """The groups ``groups``, in that order."""
        rows = [g * self.n + j for g in groups for j in range(self.n)]
        per = {name: [getattr(self, name)[r] for r in rows] for name in self.PER_ROLLOUT}
        tokens = sum(len(c) for c in per["completions"])
        prompts, golds = [self.prompts[g] for g in groups], [self.golds[g] for g in groups]
        return Groups(self.n, prompts, golds, **per, tokens=tokens, metrics=self.metrics, seconds=self.seconds)

    @staticmethod
    def join(parts: list[Groups]) -> Groups:
        first = parts[0]
        cat = {name: [x for p in parts for x in getattr(p, name)] for name in ("prompts", "golds", *Groups.PER_ROLLOUT)}
        seconds = {k: sum(p.seconds.get(k, 0.0) for p in parts) for k in first.seconds}
        return Groups(first.n, **cat, tokens=sum(p.tokens for p in parts), metrics=first.metrics, seconds=seconds)


def generate_groups(cfg: Root, engine: Engine, prompts: list[list[int]], golds: list[str]) -> Groups:
    """(2) n rollouts per prompt, (3) their scores; ``algorithm.overlong_buffer`` adds the reward term ``overlong``."""
    a, s, ds, n = cfg.algorithm, cfg.sampling, cfg.dataset, cfg.algorithm.n
    t0, version = time.perf_counter(), engine.version  # the version it serves as the batch is submitted
    ro = engine.generate(prompts, n, Sampling.draw(s))
    t1 = time.perf_counter()
    scores = score_batch(ro.texts, [g for g in golds for _ in range(n)], ds.recipe, ds.grader, timeout_s=ds.grade_timeout_s)
    if a.overlong_buffer is not None:
        for sc, c in zip(scores, ro.completion_ids):
            sc.terms = {**sc.terms, "overlong": overlong_penalty(len(c), s.max_tokens, a.overlong_buffer, a.overlong_penalty)}
    seconds = {"t_generate": t1 - t0, "t_score": time.perf_counter() - t1}
    versions = list(ro.versions) if ro.versions is not None else [version] * len(ro.completion_ids)
    per = {"completions": ro.completion_ids, "logprobs": ro.logprobs, "finish": ro.finish_reasons, "scores": scores}
    return Groups(n, list(prompts), list(golds), **per, versions=versions, tokens=ro.num_tokens, metrics=ro.metrics, seconds=seconds)


def varied(groups: Groups) -> list[int]:
    """The groups whose rewards are not all equal (``nonzero_std``), in order."""
    r = groups.rewards
    return (r.amax(dim=1) > r.amin(dim=1)).nonzero().flatten().tolist()


def fill_step(g: Generation, first: Groups, source: Source) -> tuple[Groups, Groups, dict]:
    """(3b) ``train.group_filter`` and ``train.refill_batches`` (module docstring). ``first``: the step's first batch;
    refills draw from ``source``. Returns (the groups this rank trains, every group generated this step, the metrics)."""
    t, dist = g.cfg.train, g.dist
    if t.group_filter == "none":
        return first, first, {}
    want, batches = len(first.prompts), [first]
    kept = varied(first)
    while len(batches) - 1 < t.refill_batches and dist.any(len(kept) < want):  # the same rounds on every rank
        batches.append(generate_groups(g.cfg, g.engine, *source.next()))
        kept = varied(Groups.join(batches))
    every = Groups.join(batches)
    agreed = int(-dist.reduce([-float(min(len(kept), want))], "max")[0])  # the fewest kept groups over ranks
    kept = kept[:agreed]
    filtered, refilled = dist.reduce([float(len(every.prompts) - len(varied(every))), float(sum(g >= want for g in kept))])
    metrics = {"gen_batches": len(batches), "groups_filtered": int(filtered), "groups_refilled": int(refilled)}
    return every.take(kept), every, metrics


def select_rows(alg, rewards: Tensor, keep: int, *, generator: torch.Generator | None = None, dist=None) -> tuple[Tensor, Tensor]:
    """(4)-(5) Down-sampling and advantages of one step (``alg``: the algorithm section; ``rewards: [G, n]``, this rank's).

    Returns ``(kept, advantages)``: ``kept`` as ``kept_rows`` gives it (``LongTensor[K]``) and ``advantages: [G * n]``
    float32, one per rollout of this rank, meaningful on the kept ones. PODS/GRPO (``advantage_scope: kept``): the
    advantages of each group's kept rollouts, normalised over those (0 elsewhere); D3S (``group``): the full group's
    advantages, which the rule reads, not re-normalised after selection.
    """
    advantage = ADVANTAGES.get(alg.advantage)
    G, n = rewards.shape
    if alg.advantage_scope == "group":
        group_adv = advantage(rewards)
        return downsample.kept_rows(alg.rule, group_adv, keep, generator=generator, dist=dist, alg=alg), group_adv.flatten().float()
    kept = downsample.kept_rows(alg.rule, rewards, keep, generator=generator, dist=dist, alg=alg)
    adv = torch.zeros(G * n, dtype=torch.float32)
    adv[kept] = advantage(rewards.flatten()[kept].view(G, keep)).float().flatten()
    return kept, adv


@dataclass
class Rows:
    """Rollouts as rows, one entry per row in every field: what crosses from steps (1)-(5) to the update."""

    prompt: list[list[int]]  # prompt ids
    completion: list[list[int]]  # completion ids
    logprobs: list[list[float]]  # the sampler's log-probs
    adv: list[float]  # advantages
    reward: list[float]
    group: list[int]  # the prompt group, numbered over every rank's groups
    truncated: list[bool]  # cut at sampling.max_tokens
    version: list[int]  # the oldest policy version among the row's tokens

    @staticmethod
    def of(groups: Groups, adv: Tensor, rank: int) -> Rows:
        """Every rollout of this rank's ``groups`` as a row, with its advantage (``adv: [G * n]``)."""
        n, G = groups.n, len(groups.prompts)
        return Rows(
            prompt=[groups.prompts[r // n] for r in range(G * n)],
            completion=groups.completions,
            logprobs=groups.logprobs,
            adv=adv.tolist(),
            reward=groups.rewards.flatten().tolist(),
            group=[rank * G + r // n for r in range(G * n)],
            truncated=[f == "length" for f in groups.finish],
            version=groups.versions,
        )

    def __len__(self) -> int:
        return len(self.prompt)

    def row(self, i: int) -> tuple:
        return tuple(getattr(self, f.name)[i] for f in fields(self))

    @staticmethod
    def stack(rows: list[tuple]) -> Rows:
        return Rows(*([r[k] for r in rows] for k in range(len(fields(Rows)))))

    def take(self, kept: Tensor, rule: str, dist=None) -> Rows:
        """The rows this rank trains. A per-rank rule: the rows at ``kept``. An ``across_ranks`` rule: ``kept``
        indexes every rank's rows (the same on every rank); rank r trains the r-th of W equal slices of it, so every
        rank publishes its rows that are kept (gathered on rank 0, then broadcast) and takes its slice, in ascending
        global order. Every rank trains ``len(kept) / W`` rows, as many as a per-rank rule gives it."""
        if not downsample.across_ranks(rule) or dist is None or dist.world == 1:
            return Rows.stack([self.row(i) for i in kept.tolist()])
        per, lo = kept.numel() // dist.world, dist.rank * len(self)
        own = {i: self.row(i - lo) for i in kept.tolist() if lo <= i < lo + len(self)}
        published = {i: row for part in dist.broadcast(dist.gather_object(own)) for i, row in part.items()}
        return Rows.stack([published[i] for i in kept[dist.rank * per : (dist.rank + 1) * per].tolist()])


@dataclass
class Produced:
    """What steps (2)-(5) measured on this rank's batch (seconds, counts) and the reward statistics over every rank's
    groups; the plug-ins' own metrics (the engine's, the refill's) as they report them."""

    t_generate: float
    t_score: float
    t_select: float
    tokens: int  # completion tokens generated this step (refills included)
    truncated: float  # share of rollouts cut at sampling.max_tokens
    rewards: dict[str, float]  # reward_mean_all ... (reward_metrics), and the per-prompt-length strata when logged
    engine: dict = field(default_factory=dict)  # the engine's metrics (of the step's first batch)
    refill: dict = field(default_factory=dict)  # train.group_filter's (pods docstring above)


@dataclass
class Ready:
    """One prepared batch: the rows this rank trains, the plan's micro-batch (GRPO-GA's accumulation), and what
    steps (2)-(5) measured."""

    rows: Rows
    micro_batch: int
    produced: Produced


def reward_metrics(rewards: Tensor, kept: list[float], scores, dist) -> dict:
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


def prepare(g: Generation, source: Source, progress: float) -> Ready:
    """Steps (1)-(5): the next prompts from ``source``, generate, score, filter/refill, down-sample, advantages.
    ``progress``: the training progress in [0, 1] (the plan's ramps)."""
    a, dist = g.cfg.algorithm, g.dist
    first = generate_groups(g.cfg, g.engine, *source.next())  # (1) prompts, (2) generate, (3) score
    groups, every, refill = fill_step(g, first, source)  # (3b) train.group_filter
    t0 = time.perf_counter()
    step = plan(a, len(groups.prompts), g.micro_batch_size, progress)
    kept, adv = select_rows(a, groups.rewards, step.keep, generator=source.gen, dist=dist)  # (4)-(5)
    rows = Rows.of(groups, adv, dist.rank).take(kept, a.rule, dist)  # a whole-step rule moves rows across ranks
    rewards = reward_metrics(every.rewards, rows.reward, every.scores, dist)
    if g.cfg.train.log_strata:  # per prompt length: groups, zero-variance groups, kept rollouts (this rank's; pods.d3s)
        rewards["strata"] = strata(groups.prompts, groups.rewards, rows.group, dist.rank)
    truncated = every.finish.count("length") / len(every.scores)
    seconds = {**every.seconds, "t_select": time.perf_counter() - t0}
    produced = Produced(**seconds, tokens=every.tokens, truncated=truncated, rewards=rewards, engine=first.metrics, refill=refill)
    return Ready(rows, step.micro_batch, produced)
