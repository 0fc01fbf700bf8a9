"""What every rollout engine is, returns and accepts.

An engine is a subclass of ``Engine``, built as ``cls(model_dir, tokenizer, cfg, policy=None)`` where ``cfg`` is
its own rollout section (``section``); ``policy`` is the live training module (engines that generate with it,
like HF, need no weight sync). It owns its rules (``check``, called by ``pods.config.validate`` before anything
loads) and its memory model (``memory`` and ``memory_fixes``, called by ``pods.memory``). ``PolicyEngine`` is the
base of the engines that sample with the training module. Adding an engine is one module, one
``ENGINES.register_lazy`` line (with its ``EngineSpec``), its config file and its rollout section (a class and a
``ROLLOUTS`` line in ``pods.schema.rollouts``).
"""

from __future__ import annotations

import gc
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pods.registry import Registry
from pods.schema import Section, sections

if TYPE_CHECKING:
    from pods.engines.memory import EngineMemory, Fits, Fix
    from pods.schema import Root


@dataclass(frozen=True)
class EngineSpec:
    """What choosing an engine needs, known without importing it: ``package``, a package pods does not install with
    itself (vLLM), checked before a model loads (``pods.eval.run.check_options``)."""

    package: str | None = None


ENGINES = Registry("rollout engine", spec=EngineSpec)

# What a training run held on its device (its engines, the backend, the policy module), by weak reference: the
# end-of-run suite spawns its clean process only after every one of them is gone (``pods.eval.shards``)
_HELD: list[tuple[str, weakref.ref]] = []


def remember(**held) -> None:
    """Keep a weak reference to each of a run's device holders (``name=object``; None skipped)."""
    _HELD.extend((name, weakref.ref(obj)) for name, obj in held.items() if obj is not None)


def alive() -> list[str]:
    """The names of the remembered holders still alive after a garbage collection (the dead ones forgotten)."""
    gc.collect()
    _HELD[:] = [(name, ref) for name, ref in _HELD if ref() is not None]
    return [name for name, _ in _HELD]


class Sampling(sections.Sampling):
    """One ``generate`` call's sampling: the sampling section's keys and defaults (``pods.schema.Sampling``, the only
    ones) plus the call's seed (None = unseeded). ``Sampling.draw(section, seed)`` takes them from a run's section
    (``sampling``, ``eval``, a suite); stop strings stop the engines that support them, end-of-turn ids always stop."""

    seed: int | None = None

    @classmethod
    def draw(cls, section: sections.Sampling, seed: int | None = None) -> Sampling:
        return cls(**{k: getattr(section, k) for k in sections.Sampling.model_fields}, seed=seed)


@dataclass
class Rollouts:
    """n completions per prompt, grouped: completions of prompt i are rows i*n .. i*n + n - 1.

    ``logprobs[j][t]`` is the sampler's log-probability of ``completion_ids[j][t]`` under
    softmax(logits / temperature), the same quantity the loss uses: untruncated for the HF engines always, and for
    vLLM only with top_k = -1 and top_p = 1 (vLLM records the truncated, renormalised distribution's log-probs,
    so ``VLLMEngine.check`` refuses truncation where the sampler's log-probs are read as such).
    """

    prompt_ids: list[list[int]]  # [G][P_i]
    completion_ids: list[list[int]]  # [G*n][C_j], including the end-of-turn token when produced
    texts: list[str]  # [G*n], special tokens stripped
    logprobs: list[list[float]]  # [G*n][C_j]
    finish_reasons: list[str]  # [G*n], "stop" | "length"
    n: int
    metrics: dict = field(default_factory=dict)  # engine-specific per-step numbers, merged into the step's metrics row
    versions: list[int] | None = None  # [G*n] the oldest policy version among each rollout's tokens; None: not tracked

    def __post_init__(self):
        if len(self.completion_ids) != len(self.prompt_ids) * self.n:
            raise ValueError(f"engine returned {len(self.completion_ids)} completions for {len(self.prompt_ids)} prompts x n={self.n}")

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.completion_ids))


class Engine(ABC):
    """A rollout engine. ``section``: its rollout config model (``__init__`` takes it, or a plain dict of it);
    ``needs_sync``: False when it samples with the live policy (nothing to push after an update)."""

    section: type[Section] = Section  # its pods.schema section (HfRollout, VllmRollout, ...)
    needs_sync: bool = False
    version: int = 0  # the policy version the engine now serves; each load_weights adds one

    @classmethod
    def check(cls, cfg: Root) -> None:
        """Rules this engine adds across sections (``cfg``: the typed root), before anything loads; ``ConfigError``
        in one line naming the key."""
        return None

    @classmethod
    def gap_meaning(cls, cfg: Root) -> tuple[str, str]:
        """What the sampler gap (``pods.backends.gap``) measures with this engine under ``cfg``: ("sync", "") when its
        recorded log-probs are the trainer's up to numerics; ("mismatch", why) when they differ by design (logged, never
        warned about); ("off", why) when they are another quantity (not logged)."""
        return "sync", ""

    @classmethod
    def memory(cls, cfg: Root, arch: dict, card: float | None) -> EngineMemory:
        """This engine's part of one GPU's memory estimate (``pods.memory``; ``arch``: the model's config.json fields,
        ``card``: GB or None). An engine without a memory model is not estimated (the check logs it and goes on)."""
        raise ValueError(f"the {cls.__name__} engine has no memory model")

    @classmethod
    def memory_fixes(cls, cfg: Root, fits: Fits) -> list[Fix]:
        """Settings of this engine with which a run that does not fit its card would fit (``fits`` probes one)."""
        return []

    @abstractmethod
    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling, progress: bool = False) -> Rollouts:
        """n completions of every prompt (``Rollouts``: grouped, with the sampler's log-probs)."""

    def load_weights(self, named_tensors) -> None:
        """Push new policy weights (HF names); engines that sample with the live policy have nothing to do."""
        return None

    def close(self) -> None:
        """Free what the engine holds (an engine with its own copy of the model: the copy and its KV cache)."""
        return None


class PolicyEngine(Engine):
    """An engine that samples with the live training module (``policy``, required): nothing to sync after an update,
    and its memory goes through the trainer's allocator (``pods.engines.memory.generation``, a dense KV cache of
    ``rollout.max_batch`` sequences per call unless ``kv_cache`` says otherwise). It stops on the end-of-turn ids:
    the model's generation_config eos ids and the tokenizer's eos."""

    needs_sync = False
    label = "policy"  # the engine's name in messages

    def __init__(self, model_dir, tokenizer, cfg, policy=None):
        if policy is None:
            raise ValueError(f"the {self.label} engine generates with the training model: pass policy=")
        self.policy, self.tok, self.cfg = policy, tokenizer, cfg
        eos = policy.generation_config.eos_token_id
        self.stop_ids = {i for i in (eos if isinstance(eos, list) else [eos]) if i is not None} | {tokenizer.eos_token_id}

    @classmethod
    def kv_cache(cls, cfg: Root):
        """(sequences of a call, prompt, completion tokens) -> (sequences, tokens each keeps in KV): dense."""
        from pods.engines.memory import dense

        return dense

    @classmethod
    def memory(cls, cfg: Root, arch: dict, card: float | None) -> EngineMemory:
        from pods.engines.memory import generation

        return generation(cfg, arch, cls.kv_cache(cfg))

    @classmethod
    def memory_fixes(cls, cfg: Root, fits: Fits) -> list[Fix]:
        from pods.engines.memory import fewer_sequences

        return fewer_sequences(cfg, fits)
