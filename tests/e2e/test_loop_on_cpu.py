"""The whole loop on CPU with the real tiny model, HF engine and local backend (no mocks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pods.advantages import ADVANTAGES
from pods.config import validate
from pods.loop import train
from pods.metrics import read_metrics
from pods.schema import check
from support.config import CONF, compose, shrink
from support.harness import max_gap, within

TRAIN_KEYS = {
    "step",
    "train_time",
    "t_generate",
    "t_score",
    "t_select",
    "t_update",
    "t_sync",
    "reward_mean_all",
    "reward_std_all",
    "reward_mean_kept",
    "reward_std_kept",
    "kept",
    "loss",
    "kl",
    "clip_frac",
    "grad_norm",
    "lr",
    "tokens",
    "sampler_gap",  # pods.backends.gap: every step's sync check
    "sampler_gap_max",
}
EVAL_KEYS = {"accuracy", "format_accuracy", "mean_length", "train_time", "step"}
SMALL = {"grpo": ["algorithm.n=4"], "grpo_ga": ["algorithm.n=8", "algorithm.m=4"], "grpo_pods": ["algorithm.n=8", "algorithm.m=4"]}


def _weights_changed(tiny_dir: Path, run_dir: Path) -> float:
    before, after = load_file(tiny_dir / "model.safetensors"), load_file(run_dir / "final" / "model.safetensors")
    return max((after[k] - before[k]).abs().max().item() for k in before)


@pytest.mark.parametrize("algo", ["grpo", "grpo_ga", "grpo_pods"])
def test_algorithm_trains_and_logs(algo, tiny_dir, tmp_path):
    cfg = shrink(compose([f"algorithm={algo}", *SMALL[algo]]), steps=2)
    cfg["train"]["save_final"] = True
    train(validate(cfg), tmp_path)
    assert _weights_changed(tiny_dir, tmp_path) > 0
    rows = read_metrics(tmp_path / "metrics.jsonl")
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert set(train_rows[0]) >= TRAIN_KEYS
    n, m = cfg["algorithm"]["n"], cfg["algorithm"]["m"]
    assert train_rows[0]["kept"] == cfg["train"]["prompts_per_step"] * (n if algo != "grpo_pods" else m)
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals) == 2 and set(evals[0]) >= EVAL_KEYS and 0 <= evals[-1]["accuracy"] <= 1
    assert json.loads((tmp_path / "config.json").read_text())["algorithm"]["name"] == algo
    assert train_rows[1]["train_time"] > train_rows[0]["train_time"] > 0


def test_lora_with_kl_trains_adapter_only_and_reports_kl(tiny_dir, tmp_path):
    cfg = shrink(
        compose(
            ["algorithm=grpo_pods", "algorithm.n=8", "algorithm.m=4", "hardware.finetune=lora", "algorithm.beta=0.04", "optim.lr=1e-2"]
        ),
        steps=3,
    )
    cfg["train"]["save_final"] = True
    train(validate(cfg), tmp_path)
    adapter = load_file(tmp_path / "final" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    kl = [r["kl"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")]
    assert kl[0] == 0.0  # LoRA B starts at zero: policy == reference on the first step
    assert kl[-1] > 0.0


def test_advantages_are_computed_on_the_kept_subset(tiny_dir, tmp_path, monkeypatch):
    import pods.backends.base as base
    import pods.downsample as downsample

    seen = {}
    real_select, real_update = downsample.kept_rows, base.Backend.update

    def spy_select(rule, rewards, m, generator=None, **kw):  # flat row indices g * n + j of the kept rollouts
        kept = real_select(rule, rewards, m, generator=generator, **kw)
        seen["rewards"], seen["kept"] = rewards.clone(), (kept.view(rewards.shape[0], m) % rewards.shape[1]).clone()
        return kept

    def spy_update(self, batch, lr, **kw):
        seen["adv"] = batch.advantages.clone()
        return real_update(self, batch, lr, **kw)

    monkeypatch.setattr(downsample, "kept_rows", spy_select)
    monkeypatch.setattr(base.Backend, "update", spy_update)
    cfg = shrink(compose(["algorithm=grpo_pods", "algorithm.n=8", "algorithm.m=3", "algorithm.rule=max_reward"]), steps=1)
    train(validate(cfg), tmp_path)
    kept_r = seen["rewards"].gather(1, seen["kept"])
    expected = ADVANTAGES.get("grpo")(kept_r).float().flatten()
    within(max_gap(seen["adv"], expected), 1e-5, "loop advantages vs recomputed")
    assert seen["adv"].shape[0] == 3 * cfg["train"]["prompts_per_step"]


def test_grad_accumulation_gives_the_big_batch_gradient(tiny_dir):
    from pods.backends.base import build_batch
    from pods.backends.local import LocalBackend

    grads = {}

    class Recording(LocalBackend):
        def optimizer_step(self, lr):
            grads[self.tag] = [p.grad.detach().clone() for p in self.params]
            self.optimizer.zero_grad(set_to_none=True)
            return 0.0

    cfg = compose(["algorithm=grpo_ga", "algorithm.n=8", "algorithm.m=2"])
    g = torch.Generator().manual_seed(0)
    prompts = [[1, 5, 7, 9], [2, 3]] * 4
    completions = [torch.randint(10, 200, (int(k),), generator=g).tolist() for k in torch.randint(1, 9, (8,), generator=g)]
    batch = build_batch(prompts, completions, [[0.0] * len(c) for c in completions], torch.randn(8, generator=g), 0)
    for agg in ("seq_mean", "token_mean"):
        cfg["algorithm"]["loss_agg"] = agg
        for tag, micro in (("big", 8), ("ga", 2), ("uneven", 3)):
            b = Recording(str(tiny_dir), check(cfg))
            b.tag = tag
            b.update(batch, lr=1e-3, micro_batch_size=micro)
        for big, ga, uneven in zip(grads["big"], grads["ga"], grads["uneven"]):
            scale = 1e-6 + 1e-4 * big.abs()  # allclose's atol 1e-6 + rtol 1e-4, as one ratio that must stay below 1
            within(((big - ga).abs() / scale).max().item(), 1.0, f"gradient, micro-batches of 2 vs 8 ({agg}), / (1e-6 + 1e-4|g|)")
            within(((big - uneven).abs() / scale).max().item(), 1.0, f"gradient, micro-batches of 3 vs 8 ({agg}), / (1e-6 + 1e-4|g|)")
        assert any(t.abs().max() > 0 for t in grads["big"])


def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(tiny_dir, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    base = ["algorithm=grpo_pods", "algorithm.n=8", "algorithm.m=4", "algorithm.rule=random"]
    cfg = shrink(compose(base), steps=4)
    cfg["train"]["save_final"] = True
    train(validate(cfg), straight)
    first = shrink(compose(base), steps=2)
    train(validate(first), split)
    again = shrink(compose([*base, "train.resume=auto"]), steps=4)
    again["train"]["save_final"] = True
    train(validate(again), split)
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(split / "final" / "model.safetensors")
    within(max(max_gap(a[k], b[k]) for k in a), 1e-6, "weights, resumed vs straight")
    steps = [r["step"] for r in read_metrics(split / "metrics.jsonl", "train")]
    assert steps == [1, 2, 3, 4]
    assert [r["reward_mean_all"] for r in read_metrics(split / "metrics.jsonl", "train")] == [
        r["reward_mean_all"] for r in read_metrics(straight / "metrics.jsonl", "train")
    ]


EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
FAST = "gsm8k_qwen3b_pods_64_16_l40s"  # the CPU experiments and this one GPU experiment, in-process (make test); every
# GPU experiment through python -m pods.train / torchrun, end-of-run steps included: tests/e2e/test_experiments.py


@pytest.mark.parametrize("exp", [e for e in EXPERIMENTS if e.endswith("_cpu") or e == FAST])
def test_every_experiment_runs_two_tiny_steps(exp, tiny_dir, tmp_path):
    """Each experiment's algorithm settings run for real on the tiny model (model/data/hardware swapped to CPU)."""
    cfg = compose([f"experiment={exp}"])
    tiny = shrink(compose([f"experiment={exp}"]), steps=2)
    cpu = compose([])  # the experiment's model, data, hardware, engine and logger swapped for the CPU defaults' sections
    tiny.update({k: cpu[k] for k in ("model", "dataset", "hardware", "rollout", "logger")})
    tiny["optim"]["name"] = "adamw"
    tiny["train"].update(prompts_per_step=1, group_repeats=1)  # one prompt group per step (the 8-GPU files repeat a prompt 16 times)
    assert tiny["algorithm"] == cfg["algorithm"]
    train(validate(tiny), tmp_path)
    assert len(read_metrics(tmp_path / "metrics.jsonl", "train")) == 2
