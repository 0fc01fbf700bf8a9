"""Evaluation on the test prompts: accuracy, format accuracy, both (right AND formatted: the authors'
``both_acc``, the Llama panel's metric), mean reward and completion length."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pods.engines import Sampling
from pods.schema import Eval
from pods.tasks import score_batch


def evaluate(engine, prompt_ids: list[list[int]], golds: list[str], ev: Eval, ds, seed: int, on_samples: Callable | None = None) -> dict:
    """Generate ``ev.repeats`` samples per test prompt and score them; RNG is forked so the training stream does
    not depend on how often evaluation runs. ``ds``: the dataset section (recipe, grader, grade_timeout_s);
    ``on_samples(rollouts, golds, scores)`` sees what was generated (the W&B completions table)."""
    sampling = Sampling.draw(ev, seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ro = engine.generate(prompt_ids, ev.repeats, sampling, progress=True)
    expanded = [g for g in golds for _ in range(ev.repeats)]
    scores = score_batch(ro.texts, expanded, ds.recipe, ds.grader, timeout_s=ds.grade_timeout_s)
    if on_samples is not None:
        on_samples(ro, expanded, scores)
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
