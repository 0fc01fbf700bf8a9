"""Evaluation on the test prompts: accuracy, format accuracy, both (right AND formatted: the authors'
``both_acc``, the Llama panel's metric), mean reward and completion length."""

from __future__ import annotations

import torch

from pods.engines import Sampling
from pods.tasks import score_batch


def evaluate(engine, prompt_ids: list[list[int]], golds: list[str], ev: dict, ds: dict, seed: int) -> dict:
    """Generate ``ev['repeats']`` samples per test prompt and score them; RNG is forked so the training
    stream does not depend on how often evaluation runs."""
    sampling = Sampling(
        temperature=ev["temperature"],
        top_p=ev["top_p"],
        top_k=ev["top_k"],
        max_tokens=ev["max_tokens"],
        seed=seed,
        stop=tuple(ev["stop"]),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ro = engine.generate(prompt_ids, ev["repeats"], sampling, progress=True)
    scores = score_batch(
        ro.texts, [g for g in golds for _ in range(ev["repeats"])], ds["recipe"], ds["grader"], timeout_s=ds["grade_timeout_s"]
    )
    k = len(scores)
    return {
        "accuracy": sum(s.correct for s in scores) / k,
        "format_accuracy": sum(s.formatted for s in scores) / k,
        "both_accuracy": sum(s.correct and s.formatted for s in scores) / k,
        "reward": sum(s.reward for s in scores) / k,
        "mean_length": ro.num_tokens / k,
        "timeouts": sum(s.timed_out for s in scores),
        "n_eval": k,
    }
