"""What every rollout engine returns and accepts.

An engine is built as ``cls(model_dir, tokenizer, cfg: dict, policy=None)``; ``policy`` is the live
training module (engines that generate with it, like HF, need no weight sync). It provides:
- ``generate(prompts: list[list[int]], n: int, sampling: Sampling) -> Rollouts``
- ``load_weights(named_tensors: Iterable[tuple[str, Tensor]]) -> None``: push new policy weights (HF names)
- ``needs_sync: bool``: False when the engine already generates with the live policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pods.registry import Registry

ENGINES = Registry("rollout engine")


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_tokens: int = 16
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings (engines that support them: vllm); end-of-turn ids always stop


@dataclass
class Rollouts:
    """n completions per prompt, grouped: completions of prompt i are rows i*n .. i*n + n - 1.

    ``logprobs[j][t]`` is the sampler's log-probability of ``completion_ids[j][t]`` under
    softmax(logits / temperature) (untruncated by top-k/top-p), the same quantity the loss uses.
    """

    prompt_ids: list[list[int]]  # [G][P_i]
    completion_ids: list[list[int]]  # [G*n][C_j], including the end-of-turn token when produced
    texts: list[str]  # [G*n], special tokens stripped
    logprobs: list[list[float]]  # [G*n][C_j]
    finish_reasons: list[str]  # [G*n], "stop" | "length"
    n: int
    metrics: dict = field(default_factory=dict)  # engine-specific per-step numbers, merged into the step's metrics row

    def __post_init__(self):
        if len(self.completion_ids) != len(self.prompt_ids) * self.n:
            raise ValueError(f"engine returned {len(self.completion_ids)} completions for {len(self.prompt_ids)} prompts x n={self.n}")

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.completion_ids))
