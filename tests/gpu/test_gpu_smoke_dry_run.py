"""scripts/gpu_smoke.sh on CPU (no ``gpu`` marker: these run everywhere): ``--dry-run`` lists the steps, most valuable
first (v3: round four's steps after the first five), ``--steps`` keeps a subset (a lent GPU's 10-minute calls); every
``pods.train`` step's overrides compose and pass the typed checks (a typo would cost a GPU lease); the checks script
refuses in one line without CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.config import ROOT
from support.doors import door

SMOKE = ROOT / "scripts" / "gpu_smoke.sh"
ORDER = ["env", "zero3_train", "zero3_resume", "lora4bit_merge", "lora4bit_train"]
ORDER += ["export_4bit", "zero3_accum", "suite_child", "async_lora4bit", "zero3_budget"]  # v3: round four
ORDER += ["pytest_gpu", "bench_gpu_small", "bench_step_cost"]


@pytest.fixture(scope="module")
def listing(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    done = subprocess.run(["bash", str(SMOKE), "--dry-run", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not list(out.iterdir())  # a dry run writes nothing
    return done.stdout.splitlines()


def test_dry_run_lists_the_steps_in_order_and_each_fits_one_call(listing):
    head, steps = listing[0], [line.split()[0] for line in listing[1:]]
    assert steps == ORDER
    limits = [int(line.split()[1].rstrip("s")) for line in listing[1:]]
    assert int(head.split("at most ")[1].split(" s")[0]) == sum(limits) and max(limits) <= 600
    assert sum(limits[:10]) <= 600  # the steps before the pytest and bench steps: one 10-minute call


def test_steps_keeps_a_subset_in_order(tmp_path):
    done = subprocess.run(
        ["bash", str(SMOKE), "--dry-run", "--steps", "suite_child,env", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0 and [ln.split()[0] for ln in done.stdout.splitlines()[1:]] == ["env", "suite_child"]


def train_overrides(listing) -> dict[str, list[str]]:
    runs = {}
    for line in listing[1:]:
        name, _, cmd = line.split(maxsplit=2)
        if "-m pods.train " in cmd:
            args = cmd.split("-m pods.train ", 1)[1].split(" && ")[0].split()
            runs[name] = [a for a in args if not a.startswith("hydra.")]
    return runs


def test_every_training_step_composes_and_passes_the_typed_checks(listing):
    from pods.compose import compose_plain
    from pods.config import validate
    from pods.schema import check

    runs = train_overrides(listing)
    assert sorted(runs) == ["async_lora4bit", "lora4bit_train", "zero3_budget", "zero3_resume", "zero3_train"]
    for name, overrides in runs.items():
        cfg = validate(compose_plain(overrides))  # the schema and the rules across sections (not this machine's)
        assert (cfg.model.name, cfg.hardware.device, cfg.rollout.name) == ("tiny", "cuda", "hf"), name  # no vLLM there
        if name.startswith("zero3"):
            assert (cfg.hardware.backend, cfg.hardware.deepspeed.stage, cfg.hardware.nproc_per_node) == ("deepspeed", 3, 1)
        else:
            assert (cfg.hardware.finetune, cfg.model.quantization) == ("lora", "4bit")
    assert runs["zero3_train"] and check(compose_plain(runs["zero3_train"])).eval.suite == "toy"
    budget = check(compose_plain(runs["zero3_budget"]))
    assert (budget.hardware.micro_batch_tokens, budget.train.refill_batches, budget.algorithm.loss_agg) == (
        64,
        1,
        "seq_mean_token_sum_norm",
    )
    assert check(compose_plain(runs["async_lora4bit"])).train.max_staleness == 1


def test_the_checks_refuse_in_one_line_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the refusal is for machines without one")
    checks = [sys.executable, "scripts/gpu_smoke_checks.py"]
    done = subprocess.run([*checks, "triton"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        f"gpu_smoke_checks.py: error: triton needs a CUDA device (torch {torch.__version__} sees none)"
    )
    done = door(ROOT / "scripts" / "gpu_smoke_checks.py", ["steps", "/nonexistent/run", "2"])  # in-process, as __main__
    assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
        "/nonexistent/run: no metrics.jsonl (the run did not start, or this is not a run directory)"
    )
