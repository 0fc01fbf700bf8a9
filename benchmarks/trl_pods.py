"""PODS through TRL's GRPOTrainer (``pods.integrations.trl``) against pods' own PODS loop, by optimizer step: the
pre-registered comparison of docs/integrations.md.

    python benchmarks/trl_pods.py [--seeds 0,1,2] [--steps 96] [--every 16] [--out results/cpu/trl_pods]

Both arms take ``experiment=toy_pods_64_16_cpu``'s settings (the tiny model on toy_arith, 2 prompts per step, n = 64
-> m = 16 by max variance, AdamW lr 1e-4 betas (0.9, 0.99), clip 0.2, no KL, T = 1, 12 tokens, one torch thread,
micro-batches of 16 rows, one optimizer step per generation, per-sequence token mean). pods: ``python -m pods.train``
in a process of its own. TRL: this script with ``--trl-arm`` in a process of its own, those settings mapped onto
``GRPOConfig`` (``trl_config``); at step 0 and every ``--every`` steps the TRL model's weights are copied into a pods
backend and scored by the code that scores the pods run (``pods.eval.accuracy``: 200 test prompts x 4 samples at
T = 1, seed ``eval.seed`` + k, and ``answer_prob``). The arms of one seed run side by side (one thread each).

Writes ``runs.csv`` (one row per arm, seed and evaluation; an (arm, seed) already there is not run again) and
``summary.csv`` (per step: each arm's mean over seeds and the mean paired difference TRL - pods), and prints the
verdict of the pre-registered rule (``verdict``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, typed, write_csv  # noqa: E402  (the repository on sys.path, the CPU numerics pinned)

EXPERIMENT = "toy_pods_64_16_cpu"
METRICS = ("accuracy", "answer_prob")
MARGIN, SEED_MARGIN, LEARNS = 0.05, 0.10, 0.15  # the pre-registered rule (docs/integrations.md)


# ---- 1. the arms ---------------------------------------------------------------------------------------------------


def pods_arm(seed: int, steps: int, every: int, tmp: Path) -> list[dict]:
    """pods' own loop: ``python -m pods.train`` with the experiment, its evaluation rows."""
    from pods.results.runs import load_run

    run_dir = tmp / f"pods_seed{seed}"
    cmd = [sys.executable, "-m", "pods.train", f"experiment={EXPERIMENT}", f"seed={seed}", f"train.max_steps={steps}"]
    cmd += [f"eval.every_steps={every}", f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return [{"step": r["step"], "train_time": r["train_time"], **{k: r[k] for k in METRICS}} for r in load_run(run_dir).evals]


def trl_arm(seed: int, steps: int, every: int, tmp: Path) -> list[dict]:
    """TRL with PODS: this script with ``--trl-arm`` in its own process; its evaluation rows."""
    out = tmp / f"trl_seed{seed}.json"
    cmd = [sys.executable, __file__, "--trl-arm", str(seed), "--steps", str(steps), "--every", str(every), "--json", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


def trl_config(cfg, steps: int, out_dir: str):
    """The experiment's settings as TRL's config: the kept rows of a step (prompts x m) in micro-batches of
    ``hardware.micro_batch_size``, so TRL's micro-batch (before the cut: x n / m) is prompts x n / that count."""
    from trl import GRPOConfig

    a, o, s = cfg.algorithm, cfg.optim, cfg.sampling
    assert (a.loss_agg, a.policy_loss, a.advantage, a.ppo_epochs) == ("seq_mean", "clipped", "grpo", 1), (
        "settings TRL's loss_type=grpo matches"
    )
    prompts = cfg.train.prompts_per_step
    micro = (prompts * a.m) // cfg.hardware.micro_batch_size
    return GRPOConfig(
        output_dir=out_dir, max_steps=steps, seed=cfg.seed, num_generations=a.n, per_device_train_batch_size=prompts * a.n // micro,
        gradient_accumulation_steps=micro, loss_type="grpo", epsilon=a.epsilon, beta=a.beta, mask_truncated_completions=a.mask_truncated,
        learning_rate=o.lr, adam_beta1=o.betas[0], adam_beta2=o.betas[1], adam_epsilon=o.eps, weight_decay=o.weight_decay,
        max_grad_norm=o.max_grad_norm, lr_scheduler_type="constant", warmup_steps=0, temperature=s.temperature,
        top_k=0, top_p=s.top_p, max_completion_length=s.max_tokens, gradient_checkpointing=False, use_cpu=True, bf16=False,
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
    )  # fmt: skip


def run_trl(seed: int, steps: int, every: int) -> list[dict]:
    """The TRL arm in this process: ``PodsGRPOTrainer`` plus an evaluation callback."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    from pods.integrations.trl import PodsGRPOTrainer, task_dataset, task_reward

    cfg = typed([f"experiment={EXPERIMENT}", f"seed={seed}"])
    torch.set_num_threads(cfg.hardware.torch_threads)
    evaluate, task, model_dir, tok = pods_evaluator(cfg)
    rows, clock = [], {"train": 0.0, "t": 0.0}

    class Evaluate(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            rows.append({"step": 0, "train_time": 0.0, **evaluate(model, 0)})
            clock["t"] = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            clock["train"] += time.perf_counter() - clock["t"]
            if state.global_step % every == 0 or state.global_step == steps:
                rows.append({"step": state.global_step, "train_time": round(clock["train"], 3), **evaluate(model, len(rows))})
            clock["t"] = time.perf_counter()

    a, ds = cfg.algorithm, cfg.dataset
    with tempfile.TemporaryDirectory() as out_dir:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        trainer = PodsGRPOTrainer(
            model, task_reward(ds.recipe, ds.grader), trl_config(cfg, steps, out_dir), m=a.m, rule=a.rule,
            train_dataset=Dataset.from_list(task_dataset(task.train)), processing_class=tok, callbacks=[Evaluate()],
        )  # fmt: skip
        trainer.train()
    return rows


def pods_evaluator(cfg):
    """(evaluate(model, k) -> metrics, task, model dir, tokenizer): the pods run's evaluation (``Run.evaluate``) of a
    model's weights, copied into a pods backend first; k: the evaluation's index (its sampling seed is eval.seed + k)."""
    from pods.backends import BACKENDS
    from pods.engines import ENGINES
    from pods.eval.accuracy import answer_prob, canonical_answers, evaluate
    from pods.models import load_tokenizer, resolve_model_dir
    from pods.tasks import DATASETS, encode_prompts

    ds, ev = cfg.dataset, cfg.eval
    task = DATASETS.get(ds.name)(ds)
    model_dir = resolve_model_dir(cfg.model)
    tok = load_tokenizer(model_dir)
    test_ids, test_ex, _ = encode_prompts(task.test[: ev.max_examples], tok, ds.max_prompt_length)
    answers = canonical_answers(ds.name, test_ex)
    backend = BACKENDS.get(cfg.hardware.backend)(model_dir, cfg)
    engine = ENGINES.get(cfg.rollout.name)(model_dir, tok, cfg.rollout, policy=backend.policy)

    def run(model, k: int) -> dict:
        backend.policy.load_state_dict(model.state_dict())
        res = evaluate(engine, test_ids, [ex.gold for ex in test_ex], ev, ds, ev.seed + k)
        return {"accuracy": res["accuracy"], "answer_prob": answer_prob(backend, tok, test_ids, answers)["answer_prob"]}

    return run, task, model_dir, tok


# ---- 2. the runs, one seed at a time, idempotent -----------------------------------------------------------------------


def run_all(seeds: list[int], steps: int, every: int, out: Path) -> list[dict]:
    path = out / "runs.csv"
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    done = {(r["arm"], int(r["seed"])) for r in rows}
    for seed in seeds:
        todo = [(arm, fn) for arm, fn in (("pods", pods_arm), ("trl", trl_arm)) if (arm, seed) not in done]
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
            t0 = time.time()
            got = {arm: pool.submit(fn, seed, steps, every, Path(tmp)) for arm, fn in todo}
            for arm, fut in got.items():
                rows += [{"arm": arm, "seed": seed, **r} for r in fut.result()]
        print(f"seed {seed}: {[a for a, _ in todo]} in {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
        write_csv(rows, path)
    return [{**r, "seed": int(r["seed"]), "step": int(r["step"]), **{k: float(r[k]) for k in METRICS}} for r in rows]


# ---- 3. the summary and the pre-registered rule --------------------------------------------------------------------------


def paired(rows: list[dict], metric: str) -> dict[int, dict[int, float]]:
    """{seed: {step: TRL - pods}} over the steps both arms evaluated."""
    by = {(r["arm"], r["seed"], r["step"]): r[metric] for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    return {
        s: {t: by["trl", s, t] - by["pods", s, t] for (a, s2, t) in by if a == "pods" and s2 == s and ("trl", s, t) in by} for s in seeds
    }


def verdict(rows: list[dict], metric: str = "accuracy") -> tuple[bool, str]:
    """Held when the mean over seeds of each seed's mean paired difference over the evaluations after step 0 is
    within +-MARGIN, every seed's within +-SEED_MARGIN, and the TRL arm gains >= LEARNS from step 0 to its last
    evaluation in every seed."""
    diffs = paired(rows, metric)
    per_seed = {s: statistics.mean(v for t, v in d.items() if t > 0) for s, d in diffs.items()}
    mean = statistics.mean(per_seed.values())
    trl = {s: sorted((r["step"], r[metric]) for r in rows if r["arm"] == "trl" and r["seed"] == s) for s in diffs}
    gains = {s: c[-1][1] - c[0][1] for s, c in trl.items()}
    held = abs(mean) <= MARGIN and all(abs(v) <= SEED_MARGIN for v in per_seed.values()) and all(g >= LEARNS for g in gains.values())
    sd = statistics.stdev(per_seed.values()) if len(per_seed) > 1 else float("nan")
    text = (
        f"{metric}: mean paired difference TRL - pods {mean:+.4f} (seeds: {', '.join(f'{s}: {v:+.4f}' for s, v in per_seed.items())}; "
        f"SD over seeds {sd:.4f}); TRL gain step 0 -> last {', '.join(f'{g:+.3f}' for g in gains.values())}; "
        f"rule |mean| <= {MARGIN}, each seed <= {SEED_MARGIN}, gain >= {LEARNS}: {'HELD' if held else 'FAILED'}"
    )
    return held, text


def summarise(rows: list[dict], out: Path) -> None:
    steps = sorted({r["step"] for r in rows})
    table = []
    for t in steps:
        row = {"step": t}
        for metric in METRICS:
            for arm in ("pods", "trl"):
                vals = [r[metric] for r in rows if r["arm"] == arm and r["step"] == t]
                row[f"{arm}_{metric}"] = round(statistics.mean(vals), 4) if vals else ""
            d = [v[t] for v in paired(rows, metric).values() if t in v]
            row[f"diff_{metric}"] = round(statistics.mean(d), 4) if d else ""
        table.append(row)
    write_csv(table, out / "summary.csv")
    lines = [verdict(rows, m)[1] for m in METRICS]
    (out / "verdict.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=96)
    p.add_argument("--every", type=int, default=16)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "cpu" / "trl_pods")
    p.add_argument("--trl-arm", type=int, default=None, help=argparse.SUPPRESS)  # the child process of one TRL run
    p.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.trl_arm is not None:
        a.json.write_text(json.dumps(run_trl(a.trl_arm, a.steps, a.every)))
        return
    rows = run_all([int(s) for s in a.seeds.split(",")], a.steps, a.every, a.out)
    summarise(rows, a.out)


if __name__ == "__main__":
    main()
