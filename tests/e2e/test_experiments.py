"""Every paper setting is a committed experiment file with the paper's values; every sweep file composes and
expands to the paper's runs; the tiny CPU comparison runs for real.

The paper values below are typed in from ../shared/docs/paper-facts.md, never read back from the YAML.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys

import pytest

from support.config import CONF, ROOT, compose, shrink

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
SWEEPS = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml") if not p.stem.startswith("_"))
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# ---- the paper's settings (paper-facts.md) ----------------------------------------------------------------
L40S = {  # single L40S, LoRA on a 4-bit base, 1 prompt per step, 6 h, eval of the 30-min checkpoints
    "model.quantization": "4bit",
    "hardware.finetune": "lora",
    "hardware.lora.r": 64,
    "hardware.lora.alpha": 64,
    "hardware.lora.target_modules": LORA_TARGETS,
    "rollout.name": "vllm",
    "rollout.gpu_memory_utilization": 0.5,
    "optim.name": "adamw_8bit",
    "optim.lr": 5e-6,
    "optim.schedule": "constant",
    "optim.warmup_ratio": 0.0,
    "optim.betas": [0.9, 0.99],
    "optim.weight_decay": 0.1,
    "optim.max_grad_norm": 0.1,
    "sampling.temperature": 0.9,
    "sampling.max_tokens": 512,
    "dataset.max_prompt_length": 512,
    "algorithm.beta": 0.0,
    "algorithm.epsilon": 0.2,
    "algorithm.loss_agg": "seq_mean",
    "algorithm.loss_temperature": "sampling",
    "train.prompts_per_step": 1,
    "train.group_repeats": 1,
    "train.time_budget_s": 6 * 3600,
    "train.checkpoint_every_s": 1800,
    "eval.every_s": 1800,
    "eval.temperature": 0.9,
    "eval.repeats": 5,
    "eval.max_tokens": 512,
    "eval.max_examples": None,
}
QWEN3B, QWEN7B, LLAMA3B = "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.2-3B-Instruct"
GRPO = {"algorithm.name": "grpo", "algorithm.rule": "all", "algorithm.grad_accum": False}
PODS = {"algorithm.name": "grpo_pods", "algorithm.rule": "max_variance", "algorithm.grad_accum": False}
RELEASE = {"dataset.prompt_format": "pods_instruct", "dataset.grader": "lenient"}  # the published Qwen runs' prompt and grader
GSM8K = {**RELEASE, "dataset.name": "gsm8k", "dataset.recipe": "pods_release"}  # correctness + format bonus when wrong
MATH = {**RELEASE, "dataset.name": "math", "dataset.recipe": "correctness"}  # MATH: correctness only
LLAMA = {
    "model.path": LLAMA3B,
    "dataset.recipe": "pods_0c453d2",
    "algorithm.beta": 0.04,
    "train.time_budget_s": 5400,
    "train.checkpoint_every_s": 600,
    "eval.every_s": 600,
}
X8 = {  # 8 GPUs, full fine-tuning, 40 min, eval every 2 min of training time on the full GSM8K test set
    "model.quantization": None,
    "hardware.finetune": "full",
    "hardware.dtype": "bfloat16",
    "hardware.gradient_checkpointing": True,
    "rollout.name": "vllm",
    "optim.lr": 2e-5,
    "optim.schedule": "cosine",
    "optim.warmup_ratio": 0.1,
    "sampling.temperature": 0.9,
    "sampling.max_tokens": 1024,
    "algorithm.beta": 0.0,
    "algorithm.epsilon": 0.2,
    "train.time_budget_s": 40 * 60,
    "eval.every_s": 120,
    "eval.max_examples": None,
    "dataset.name": "gsm8k_open_r1",
    "dataset.recipe": "open_r1",
    "dataset.grader": "math_verify_strict",
    "dataset.prompt_format": "open_r1",  # open-r1 style
    "algorithm.loss_agg": "bnpo",
    "optim.betas": [0.9, 0.999],
    "sampling.top_k": 50,  # TRL 0.17 / HF Trainer defaults
    "hardware.micro_batch_size": 32,  # the per-GPU memory limit: GRPO-GA accumulates 16 x 32, PODS 4 x 32
}
GA_32 = {
    "algorithm.name": "grpo_ga",
    "algorithm.grad_accum": True,
    "algorithm.n": 32,
    "algorithm.m": 32,
    "train.prompts_per_step": 16,
    "train.group_repeats": 16,
}
PODS_128_32 = {
    "algorithm.name": "grpo_pods",
    "algorithm.rule": "max_variance",
    "algorithm.n": 128,
    "algorithm.m": 32,
    "train.prompts_per_step": 4,
    "train.group_repeats": 4,
}
# 7B next to vLLM's 40 GB: micro-batches of 16 fit an 80 GB A100, 32 do not (pods.memory); the gradient is the same
QWEN7B_A100 = {"model.path": QWEN7B, "hardware.name": "a100x8_zero3", "hardware.micro_batch_size": 16}

PAPER = {
    "gsm8k_qwen3b_grpo_16_16_l40s": {**L40S, **GRPO, **GSM8K, "model.path": QWEN3B, "algorithm.n": 16, "algorithm.m": 16},
    "gsm8k_qwen3b_pods_64_16_l40s": {**L40S, **PODS, **GSM8K, "model.path": QWEN3B, "algorithm.n": 64, "algorithm.m": 16},
    "math_qwen3b_grpo_8_8_l40s": {**L40S, **GRPO, **MATH, "model.path": QWEN3B, "algorithm.n": 8, "algorithm.m": 8},
    "math_qwen3b_pods_32_8_l40s": {**L40S, **PODS, **MATH, "model.path": QWEN3B, "algorithm.n": 32, "algorithm.m": 8},
    "gsm8k_llama3b_grpo_16_16_l40s": {**L40S, **GRPO, **LLAMA, "dataset.name": "gsm8k", "algorithm.n": 16, "algorithm.m": 16},
    "gsm8k_llama3b_pods_64_16_l40s": {**L40S, **PODS, **LLAMA, "dataset.name": "gsm8k", "algorithm.n": 64, "algorithm.m": 16},
    "gsm8k_qwen3b_grpo_ga_h100x8": {**X8, **GA_32, "model.path": QWEN3B, "hardware.name": "h100x8_zero3"},
    "gsm8k_qwen3b_pods_h100x8": {**X8, **PODS_128_32, "model.path": QWEN3B, "hardware.name": "h100x8_zero3"},
    "gsm8k_qwen7b_grpo_ga_a100x8": {**X8, **GA_32, **QWEN7B_A100},
    "gsm8k_qwen7b_pods_a100x8": {**X8, **PODS_128_32, **QWEN7B_A100},
}
CPU_ARMS = {"toy_grpo_16_16_cpu": (16, 16), "toy_grpo_ga_64_16_cpu": (64, 64), "toy_pods_64_16_cpu": (64, 16)}  # (n, kept per prompt)

SEEDS_L40S, SEEDS_X8 = list(range(1, 11)), [11, 12, 13, 14, 15, 21, 22, 23, 24, 25]
SWEEP_PAPER = {  # sweep -> (experiment it applies to, {swept key: values}, {fixed key: value})
    "n_sweep": ("gsm8k_qwen3b_pods_64_16_l40s", {"algorithm.n": [16, 32, 64, 128, 256], "seed": SEEDS_L40S}, {"algorithm.m": 16}),
    "m_sweep": ("gsm8k_qwen3b_pods_64_16_l40s", {"algorithm.m": [16, 8, 4, 2], "seed": SEEDS_L40S}, {"algorithm.n": 64}),
    "rules": (
        "gsm8k_qwen3b_pods_64_16_l40s",
        {"algorithm.rule": ["max_variance", "max_reward", "random"], "seed": SEEDS_L40S},
        {"algorithm.n": 64, "algorithm.m": 16},
    ),
    "seeds_single_gpu": ("gsm8k_qwen3b_grpo_16_16_l40s", {"seed": SEEDS_L40S}, {}),
    "seeds_multi_gpu": ("gsm8k_qwen3b_pods_h100x8", {"seed": SEEDS_X8}, {}),
    "seeds_cpu": ("toy_pods_64_16_cpu", {"seed": list(range(1, 11))}, {}),  # the paper's 10 seeds per arm
    "seeds_per_step_cpu": ("toy_binary_pods_64_16_cpu", {"seed": [1, 2, 3, 4, 5]}, {}),
    "d3s_cpu": ("d3s_toy_cpu", {"seed": [1, 2, 3], "algorithm": ["grpo", "grpo_pods", "d3s", "d3s_cross"]}, {}),
    "sparse_rl_cpu": ("sparse_rl_toy_cpu", {"seed": [1, 2, 3], "algorithm.correction": ["none", "sparse_rl"]}, {}),
}


def get(cfg: dict, dotted: str):
    for k in dotted.split("."):
        cfg = cfg[k]
    return cfg


def composed(overrides: list[str], hydra: bool = False):
    """Compose (resolved, throw_on_missing); ``hydra``: with the hydra section (launcher, sweeper)."""
    if not hydra:
        return compose(overrides)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)


def validated(cfg: dict) -> dict:
    """pods.config.validate with the model swapped for the tiny one (no hub access): every name must be registered.
    Multi-GPU profiles are validated as torchrun's ranks see them (WORLD_SIZE set)."""
    import os
    from unittest import mock

    from pods.config import validate

    with mock.patch.dict(os.environ, {"WORLD_SIZE": str(cfg["hardware"].get("nproc_per_node") or 1)}):
        validate({**cfg, "model": {"name": "tiny", "builder": "tiny", "path": None, "spec": {}}})
    return cfg


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_experiment_composes_and_validates(exp):
    lines = (CONF / "experiment" / f"{exp}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_" and f"experiment={exp}" in lines[1], f"{exp}: first comment must be the command"
    validated(composed([f"experiment={exp}"]))


def test_every_paper_setting_has_a_file():
    assert set(PAPER) | set(CPU_ARMS) <= set(EXPERIMENTS)


@pytest.mark.parametrize("exp", sorted(PAPER))
def test_paper_values(exp):
    cfg = composed([f"experiment={exp}"])
    got = {k: get(cfg, k) for k in PAPER[exp]}
    assert got == PAPER[exp]
    if exp.endswith("x8"):  # the same rollouts per GPU per optimizer step in both arms (512)
        assert cfg["algorithm"]["n"] * cfg["train"]["prompts_per_step"] == 512


FAST_SWEEPS = {"n_sweep", "m_sweep"}  # the fast tier expands the paper's two ablations; make test-all every sweep x both


@pytest.mark.parametrize(
    "sweep,exp",
    [
        (sweep, exp) if exp == "paper" and sweep in FAST_SWEEPS else pytest.param(sweep, exp, marks=pytest.mark.slow)
        for sweep in SWEEPS
        for exp in ("toy_pods_64_16_cpu", "paper")
    ],
)
def test_sweep_composes_and_expands_to_the_papers_runs(sweep, exp):
    from pods.figures import sweep_jobs

    paper_exp, swept, fixed = SWEEP_PAPER[sweep]
    exp = paper_exp if exp == "paper" else exp
    composed([f"experiment={exp}", f"+sweep={sweep}"], hydra=True)
    jobs, task = sweep_jobs(exp, sweep)  # what `python -m pods.train -m experiment=EXP +sweep=SWEEP` launches
    assert len(jobs) == math.prod(len(v) for v in swept.values())
    values = {}
    for job in jobs:
        for o in job:
            k, v = o.split("=", 1)
            values.setdefault(k, []).append(v)
    assert {k: list(dict.fromkeys(v)) for k, v in values.items()} == {k: [str(x) for x in v] for k, v in swept.items()}
    assert {k: get(task, k) for k in fixed} == fixed
    assert task["train"]["resume"] == "auto"  # a re-run (or a requeued job) continues unfinished runs
    for job in jobs[:: max(1, len(jobs) // 10)]:  # the jobs are valid configs (e.g. n = 16 with m = 16, max-variance)
        validated(composed([f"experiment={exp}", f"+sweep={sweep}", *job]))


def test_slurm_launchers_resolve_to_submitit_1_2_0_fields():
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from omegaconf import OmegaConf

    fields = set(SlurmQueueConf.__dataclass_fields__)
    for launcher, hw, gpus in [("slurm", "l40s_lora", 1), ("slurm_cpu", "cpu", None)]:
        cfg = composed([f"hydra/launcher={launcher}", f"hardware={hw}"], hydra=True)
        node = OmegaConf.to_container(cfg.hydra.launcher, resolve=True, throw_on_missing=True)
        assert set(node) <= fields, set(node) - fields
        assert node["gpus_per_node"] == gpus and node["array_parallelism"] >= 1 and node["timeout_min"] >= 1


def test_cpu_comparison_arms_run_two_steps(tiny_dir, tmp_path):
    """The *_cpu arms of `make reproduce-figure-cpu` run as committed (shrunk to 2 steps) and train on what they should."""
    from pods.config import validate
    from pods.loop import train
    from pods.metrics import read_metrics

    for exp, (n, kept) in CPU_ARMS.items():
        cfg = shrink(compose([f"experiment={exp}"]))
        assert cfg["model"]["builder"] == "tiny" and cfg["hardware"]["device"] == "cpu"
        train(validate(cfg), tmp_path / exp)
        rows = read_metrics(tmp_path / exp / "metrics.jsonl", "train")
        assert len(rows) == 2 and all(r["kept"] == kept * cfg["train"]["prompts_per_step"] for r in rows), exp
        assert cfg["algorithm"]["n"] == n


def test_figures_from_the_authors_released_curves(shared_dir, tmp_path, capsys):
    """`make figure-*` on the authors' curves alone: PODS reaches GRPO's peak 2x sooner on GSM8K (their claim: >= 1.7x)."""
    from pods.figures import plot

    curves = plot("3-gsm8k-qwen3b-l40s", tmp_path / "no-runs", tmp_path, shared_dir / "reference")
    assert {c["label"] for c in curves} == {"GRPO 16/16", "PODS 64→16"} and {c["runs"] for c in curves} == {10}
    assert "speed-up 2.00x" in capsys.readouterr().out
    assert (tmp_path / "accuracy_vs_time.png").stat().st_size > 10_000 and (tmp_path / "mean_curves.csv").exists()


# ---- every experiment through the command line, end-of-run steps included (issue 32 item 0) ---------------------
# `python -m pods.train experiment=X` (torchrun with 2 gloo ranks for a several-GPU profile) plus, for a GPU experiment,
# overrides that swap in the tiny model and the CPU sections (a *_cpu experiment runs as committed, shrunk): the experiment's keys in those sections that the CPU ones lack are deleted
# (`~key`), the others set to the CPU default's value; the algorithm, optimiser schedule and training keys are the
# experiment's, shrunk to 2 steps. An experiment's eval.suite becomes the toy suite on 4 + 2 problems (the HF engine): its
# end (final/, the process group destroyed, the suite in clean processes, one per rank, merged) runs as on a GPU.
# Tiers and cost: the 17 GPU files in make test-all (6 single-process runs, 11 on 2 ranks), one of them in make test.
# Measured (all 17, 2026-11-28, load 14-16 on 2 shared cores): 35 min wall, 11.5 CPU-minutes (about 25 s a
# single-process run, 50 s a 2-rank one, suite included): at load 1-2 about 8 min of make test-all (estimated from the
# CPU time, not measured idle). The 15 *_cpu files run as committed, in-process, in make test
# (tests/e2e/test_loop_on_cpu.py::test_every_experiment_runs_two_tiny_steps); through this command line they would add
# ~4 min to make test-all, past its 40 min.
CPU_GROUPS = {"model": "tiny", "dataset": "toy_arith", "rollout": "hf", "logger": "none"}
SHRUNK = [
    "train.max_steps=2",
    "train.time_budget_s=null",
    "train.prompts_per_step=1",
    "train.group_repeats=1",
    "train.checkpoint_every_s=null",
    "train.checkpoint_every_steps=null",
    "eval.at_start=false",
    "eval.max_examples=8",
    "eval.repeats=1",
    "eval.every_s=null",
    "eval.every_steps=null",
    "sampling.max_tokens=12",
    "eval.max_tokens=12",
    "optim.name=adamw",
]
TOY_SUITE = [
    "eval.suite=toy",
    "eval.suite_engine=hf",
    'eval.suite_overrides=["suite.samples=2","suite.benchmarks.toy_arith.size=4","suite.benchmarks.toy_long.size=2"]',
]


def value(v) -> str:
    """``v`` as a Hydra override value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ",".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{value(x)}" for k, x in v.items()) + "}"
    return "'" + str(v).replace("'", "\\'") + "'"


def section_swap(got: dict, want: dict, prefix: str) -> list[str]:
    """Overrides that turn section ``got`` into ``want``: keys ``want`` lacks deleted, differing leaves set."""
    out = []
    for k, v in got.items():
        key = f"{prefix}.{k}"
        if k not in want:
            out.append(f"~{key}")
        elif isinstance(v, dict) and isinstance(want[k], dict):
            out += section_swap(v, want[k], key)
        elif v != want[k]:
            out.append(f"{key}={value(want[k])}")
    return out


@functools.cache
def composed_once(*overrides: str) -> dict:
    """``compose`` for the read-only callers below (cpu_swap, signature): each command line composed once per process."""
    return compose(list(overrides))


def cpu_swap(exp: str) -> tuple[list[str], int]:
    """(overrides after ``experiment=exp``, ranks): the tiny model and CPU sections swapped in, shrunk to 2 steps."""
    cfg = composed_once(f"experiment={exp}")
    ranks = 2 if cfg["hardware"]["nproc_per_node"] > 1 else 1
    groups = {**CPU_GROUPS, "hardware": "cpu_ddp2_zero3" if ranks > 1 else "cpu"} if cfg["hardware"]["device"] == "cuda" else {}
    choices = [f"{g}={c}" for g, c in groups.items()]
    got, want = composed_once(f"experiment={exp}", *choices), composed_once(*choices)
    args = choices + [o for g in groups for o in section_swap(got[g], want[g], g)]
    if groups and ranks > 1 and cfg["hardware"]["backend"] == "deepspeed":  # the experiment's ZeRO stage on the 2 CPU ranks
        args.append(f"hardware.deepspeed.stage={cfg['hardware']['deepspeed']['stage']}")
    return args + SHRUNK + (TOY_SUITE if cfg["eval"]["suite"] else []), ranks


def run_command_line(exp: str, run_dir, log) -> dict:
    """The experiment through ``python -m pods.train``: in-process (``support.doors``) for one rank and an HF engine,
    torchrun for 2 ranks, a process of its own for a vLLM engine; its config.json."""
    from support.doors import door
    from support.harness import free_port, worker_env

    args, ranks = cpu_swap(exp)
    start = [sys.executable]
    if ranks > 1:
        start += ["-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(free_port())]
    cmd = [*start, "-m", "pods.train", f"experiment={exp}", *args, f"hydra.run.dir={run_dir}"]
    if ranks == 1 and not composed_once(f"experiment={exp}", *args)["rollout"]["name"].startswith("vllm"):
        p = door("pods.train", cmd[3:], env={"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None})  # no launcher's variables
    else:
        p = subprocess.run(cmd, cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=900)
    log.write_text(" ".join(cmd) + "\n" + p.stdout + "\n--- stderr ---\n" + p.stderr)
    assert p.returncode == 0, f"{exp}: exit {p.returncode}; log {log}\n{p.stderr[-3000:]}"
    return json.loads((run_dir / "config.json").read_text())


FAST_CLI = "gsm8k_qwen3b_pods_64_16_l40s"  # make test runs this one (the *_cpu files: below)
GPU_FILES = [e for e in EXPERIMENTS if not e.endswith("_cpu")]
# make test-all runs one GPU file per code path the command line takes here (the signature below: the model and data
# are swapped for the tiny ones, so files that differ only there take the same path); make test-experiments runs all.
# test_each_code_path_of_the_gpu_files_runs_in_test_all fails when a new file brings a signature none of these has.
PATHS = [
    FAST_CLI,
    "gsm8k_qwen3b_grpo_16_16_l40s",
    "gsm8k_qwen3b_grpo_ga_h100x8",
    "gsm8k_qwen3b_pods_h100x8",
    "d3s_llama3_1_8b_grpo_h100x8",
    "d3s_qwen2_5_math_7b_grpo_h100x8",
    "d3s_qwen2_5_math_7b_grpo_baseline_h100x8",
    "d3s_qwen2_5_math_7b_grpo_pods_h100x8",
    "sparse_rl_qwen2_5_3b_dense",
    "sparse_rl_qwen2_5_3b_rkv",
    "gsm8k_qwen0_5b_grpo_ga_1gpu",  # the one-GPU quickstart: full fine-tuning, one process, colocated vLLM
    "gsm8k_qwen0_5b_pods_1gpu",
]


def signature(exp: str) -> tuple:
    """What decides the command line's code path for a GPU file run on the tiny model: the command line it runs here
    (``cpu_swap``: ranks, profile, ZeRO stage, micro-batch, suite; model and data left out, they are the tiny ones, and
    the SLURM resources, a local launch never reads them), the algorithm, the engine. Two GPU profiles that run here as
    the same command line are one path (a100x8_zero3 is h100x8_zero3 with another micro-batch; both become 64 here)."""
    c = composed_once(f"experiment={exp}")
    args, ranks = cpu_swap(exp)
    here = tuple(a for a in args if not a.startswith(("model", "dataset", "~dataset", "hardware.slurm")))  # slurm: SLURM only
    return ranks, here, c["algorithm"]["name"], c["rollout"]["name"]


def test_each_code_path_of_the_gpu_files_runs_in_test_all():
    have = {signature(e) for e in PATHS}
    assert set(PATHS) <= set(GPU_FILES) and len(have) == len(PATHS)  # no two representatives of one path
    assert [e for e in GPU_FILES if signature(e) not in have] == []


def tier(exp: str):
    if exp == FAST_CLI:
        return exp
    return pytest.param(exp, marks=[pytest.mark.slow] + ([] if exp in PATHS else [pytest.mark.exhaustive]))


@pytest.mark.parametrize("exp", [tier(e) for e in GPU_FILES])
def test_every_experiment_runs_through_the_command_line(exp, tiny_dir, tmp_path):
    from pods.metrics import read_metrics

    run_dir = tmp_path / "run"
    cfg = run_command_line(exp, run_dir, tmp_path / "run.log")
    assert cfg["algorithm"] == compose([f"experiment={exp}"])["algorithm"]  # the experiment's algorithm, as committed
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "train")] == [1, 2]
    if cfg["eval"]["suite"]:  # the end-of-run suite finished, merged from one share per rank
        summary = json.loads((run_dir / "eval" / "toy" / "summary.json").read_text())
        assert {b: m["problems"] for b, m in summary["benchmarks"].items()} == {"toy_arith": 4, "toy_long": 2}
        assert summary.get("shards", 1) == (2 if cfg["hardware"]["nproc_per_node"] > 1 else 1)
        assert not (run_dir / "eval" / "toy" / "shards").exists()
