"""Evaluation on the test prompts: accuracy, format accuracy, both (right AND formatted: the authors'
``both_acc``, the Llama panel's metric), mean reward and completion length; for tasks with a canonical answer (the
toy tasks) also ``answer_prob``, the policy's teacher-forced probability of it (no sampling noise)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pods.backends.batch import build_batch
from pods.engines import Sampling
from pods.schema import Eval
from pods.tasks import DATASETS, score_batch


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


def canonical_answers(dataset: str, examples) -> list[str] | None:
    """Each example's canonical answer text (the dataset's registered ``sft_target``: the toy tasks'), or None
    when the dataset names none (GSM8K, MATH: no single right completion)."""
    target = DATASETS.spec(dataset).sft_target
    return None if target is None else [target(ex) for ex in examples]


def answer_prob(backend, tok, prompt_ids: list[list[int]], answers: list[str]) -> dict:
    """The mean over prompts of the policy's teacher-forced probability of the canonical completion (answer text +
    end-of-turn token): exp(sum over its C tokens of log p) per prompt, one forward pass without grad (the
    backend's micro-batches). A noise-free curve beside sampled accuracy; the RNG is forked, so a forward that
    draws (dropout) leaves the training stream as it was."""
    if not prompt_ids:
        return {"answer_prob": 0.0}
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    comp = [tok(a, add_special_tokens=False)["input_ids"] + eos for a in answers]
    batch = build_batch(prompt_ids, comp, [[0.0] * len(c) for c in comp], torch.zeros(len(comp)), tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        logp = backend.policy_logprobs(batch)  # [B, C]
    seq = (logp * batch.loss_mask).sum(-1).exp()  # [B] probability of each whole canonical completion
    return {"answer_prob": float(seq.mean())}
