"""Figures: which metric each panel plots."""

from __future__ import annotations

import csv

import pytest


def test_llama_panel_plots_answer_and_format_accuracy(shared_dir, tmp_path):
    """The Llama panel's metric is the authors' both_acc (right AND formatted): the plotted authors' mean at
    the first checkpoint (10 min) is the mean of both_acc over their GRPO 16/16 runs there, not of ans_acc."""
    from pods.figures import plot

    curves = plot("3-gsm8k-llama3b-l40s", tmp_path / "no-runs", tmp_path, shared_dir / "reference")
    with (shared_dir / "reference" / "pods_single_gpu_curves.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if (r["model"], r["train_set"], r["eval_set"], r["n"], r["m"], r["checkpoint_index"])
                == ("Llama-3.2-3B-Instruct", "gsm8k", "gsm8k", "16", "16", "1")]
    both = sum(float(r["both_acc"]) for r in rows) / len(rows)
    ans = sum(float(r["ans_acc"]) for r in rows) / len(rows)
    point = next(c for c in curves if c["label"] == "GRPO 16/16" and c["time"] == pytest.approx(600.0))
    assert point["mean"] == pytest.approx(both) and abs(both - ans) > 1e-3


def test_evaluation_logs_both_accuracy(tiny_dir):
    """evaluate() reports both_accuracy = the share of samples right AND formatted (tiny model, toy task): the
    same samples regenerated from the same seed and scored here give the same share."""
    import torch

    from pods.engines import ENGINES, Sampling
    from pods.evaluate import evaluate
    from pods.models import load_policy, load_tokenizer
    from pods.tasks import DATASETS, encode_prompts, score_batch
    from pods.tiny import DEFAULT_SPEC

    tok = load_tokenizer(str(tiny_dir))
    engine = ENGINES.get("hf")(str(tiny_dir), tok, {"max_batch": 256}, policy=load_policy(str(tiny_dir), {"dtype": "float32"}))
    ids, kept, _ = encode_prompts(DATASETS.get("toy_arith")(DEFAULT_SPEC["dataset"]).test[:60], tok, 128)
    golds = [e.gold for e in kept]
    ev = {"temperature": 1.0, "max_tokens": 12, "repeats": 2}
    res = evaluate(engine, ids, golds, ev, {"recipe": "toy", "grader": "toy"}, seed=3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        ro = engine.generate(ids, 2, Sampling(temperature=1.0, max_tokens=12, seed=3))
    scores = score_batch(ro.texts, [g for g in golds for _ in range(2)], "toy", "toy")
    both = sum(s.correct and s.formatted for s in scores) / len(scores)
    assert res["both_accuracy"] == pytest.approx(both)
    assert res["both_accuracy"] < res["format_accuracy"] or res["both_accuracy"] < res["accuracy"]  # not a copy of either
