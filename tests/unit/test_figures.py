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
        rows = [
            r
            for r in csv.DictReader(f)
            if (r["model"], r["train_set"], r["eval_set"], r["n"], r["m"], r["checkpoint_index"])
            == ("Llama-3.2-3B-Instruct", "gsm8k", "gsm8k", "16", "16", "1")
        ]
    both = sum(float(r["both_acc"]) for r in rows) / len(rows)
    ans = sum(float(r["ans_acc"]) for r in rows) / len(rows)
    point = next(c for c in curves if c["label"] == "GRPO 16/16" and c["time"] == pytest.approx(600.0))
    assert point["mean"] == pytest.approx(both) and abs(both - ans) > 1e-3


def test_evaluation_logs_both_accuracy(tiny_dir):
    """evaluate() reports both_accuracy = the share of samples right AND formatted (tiny model, toy task): the
    same samples regenerated from the same seed and scored here give the same share."""
    import torch

    from pods.engines import ENGINES, Sampling
    from pods.eval.accuracy import evaluate
    from pods.models import load_policy, load_tokenizer
    from pods.schema import Eval, Hardware, HfRollout, ToyDataset, complete
    from pods.tasks import DATASETS, encode_prompts, score_batch
    from pods.tiny import dataset_section

    tok = load_tokenizer(str(tiny_dir))
    engine = ENGINES.get("hf")(
        str(tiny_dir),
        tok,
        complete(HfRollout, name="hf"),
        policy=load_policy(str(tiny_dir), complete(Hardware, name="cpu", dtype="float32")),
    )
    ids, kept, _ = encode_prompts(DATASETS.get("toy_arith")(dataset_section()).test[:60], tok, 128)
    golds = [e.gold for e in kept]
    ev = complete(Eval, temperature=1.0, max_tokens=12, repeats=2)
    res = evaluate(engine, ids, golds, ev, complete(ToyDataset, name="toy_arith", recipe="toy", grader="toy"), seed=3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        ro = engine.generate(ids, 2, Sampling(temperature=1.0, max_tokens=12, seed=3))
    scores = score_batch(ro.texts, [g for g in golds for _ in range(2)], "toy", "toy")
    both = sum(s.correct and s.formatted for s in scores) / len(scores)
    assert res["both_accuracy"] == pytest.approx(both)
    assert res["both_accuracy"] < res["format_accuracy"] or res["both_accuracy"] < res["accuracy"]  # not a copy of either


TINY = [
    "model=tiny",
    "model.quantization=null",
    "hardware=cpu",
    "rollout=hf",
    "dataset=toy_arith",
    "optim.name=adamw",
    "train.max_steps=1",
    "train.time_budget_s=null",
    "train.checkpoint_every_s=null",
    "eval.max_examples=4",
    "eval.repeats=1",
    "eval.every_s=null",
    "sampling.max_tokens=8",
    "eval.max_tokens=8",
    "logger=none",
]  # any paper experiment as a seconds-long CPU run


def test_run_key_ignores_bookkeeping_only():
    from pods.figures import resolved
    from pods.launch import run_key

    base = resolved("gsm8k_qwen3b_pods_64_16_l40s", ["seed=1"])
    same = resolved("gsm8k_qwen3b_pods_64_16_l40s", ["seed=1", "train.resume=auto", "logger=wandb"])
    assert run_key(base) == run_key(same)
    assert run_key(base) != run_key(resolved("gsm8k_qwen3b_pods_64_16_l40s", ["seed=2"]))
    assert run_key(base) != run_key(resolved("gsm8k_qwen3b_pods_64_16_l40s", ["seed=1", "algorithm.n=128"]))


def test_figures_share_runs_by_config(tmp_path, monkeypatch):
    """Planning only (the launch itself is replaced by marking the run finished; the slow test below launches for
    real): Fig. 3's GSM8K panel, then Figs. 4-n, 4-m and 5 launch each distinct config once; 4-n, 4-m and 5 list
    Fig. 3's PODS 64->16 seed-1 run as theirs."""
    from pods import figures, launch
    from pods.results.runs import listed

    launched = []

    def fake_launch(jobs, launcher, **kw):
        for job in jobs:
            launched.append(job.run_dir)
            launch.mark(job.run_dir, "finished", launcher, job.overrides)
        return []

    monkeypatch.setattr(launch, "launch", fake_launch)
    for name in ["3-gsm8k-qwen3b-l40s", "4-n", "4-m", "5"]:
        figures.reproduce(name, "local", tmp_path / name, "1", [])
    assert len(launched) == len(set(launched)) == 2 + 4 + 3 + 2  # 64->16 max-variance once, for all four figures
    pods_run = listed(tmp_path / "3-gsm8k-qwen3b-l40s")
    for name in ["4-n", "4-m", "5"]:
        assert set(pods_run) & set(listed(tmp_path / name)), name


@pytest.mark.slow
def test_reproduce_figure_4n_after_figure_3_starts_no_run_twice(tiny_dir, tmp_path):
    """`pods.figures reproduce 3-gsm8k-qwen3b-l40s` then `4-n` with the local launcher (tiny model, one step,
    seed 1): 2 + 4 runs start, the PODS 64->16 run of Fig. 3 is reused by 4-n, and 4-n's plot reads it."""
    import os
    import subprocess
    import sys

    from pods.launch import status
    from pods.results.runs import listed
    from support.config import ROOT

    def run(name):
        cmd = [
            sys.executable,
            "-m",
            "pods.figures",
            "reproduce",
            name,
            *TINY,
            "--launcher",
            "local",
            "--seeds",
            "1",
            "--runs",
            str(tmp_path / name),
        ]
        if name == "4-n":  # in-process (support.doors); 3-gsm8k-qwen3b-l40s is pods.figures' real process
            from support.doors import door

            p = door("pods.figures", cmd[3:], env={"OMP_NUM_THREADS": "1"})  # its runs' processes inherit it
            assert p.returncode == 0, p.stderr[-3000:]
            return p.stdout
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout

    out3, out4 = run("3-gsm8k-qwen3b-l40s"), run("4-n")
    started = [line for line in (out3 + out4).splitlines() if "-m pods.train" in line]
    assert len(started) == 6 and out4.count("[figures] reusing") == 1, out4
    store = sorted((tmp_path / "by-config").iterdir())
    assert len(store) == 6 and all(status(d)["status"] == "finished" for d in store)
    assert set(listed(tmp_path / "3-gsm8k-qwen3b-l40s")) & set(listed(tmp_path / "4-n"))
    again = run("4-n")
    assert again.count("[figures] reusing") == 5 and again.count("-m pods.train") == 0  # all finished: nothing starts
