"""On a CUDA machine (``make gpu-check``; marked ``gpu``, skipped without CUDA): what only a GPU can show about the
checks made before a run, and a tiny run on the GPU in each training dtype."""

from __future__ import annotations

import pytest

from support.config import compose, shrink

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_run_on_cuda(tiny_dir, tmp_path, dtype):
    from pods.config import validate
    from pods.loop import train
    from pods.metrics import read_metrics

    cfg = shrink(compose(["hardware.device=cuda", f"hardware.dtype={dtype}", "algorithm.n=4", "algorithm.m=2"]))
    train(validate(cfg), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert len(rows) == 2 and all(r["kept"] == 2 * cfg["train"]["prompts_per_step"] for r in rows)


def test_the_machine_checks_accept_gpu_settings_on_a_gpu():
    """What a CPU refuses (tests/unit/test_bad_inputs.py) passes where CUDA is: float16, the L40S profile, 8-bit AdamW."""
    from pods import schema
    from pods.preflight import check_environment

    for overrides in (["hardware.device=cuda", "hardware.dtype=float16"], ["hardware=l40s_lora", "optim.name=adamw_8bit"]):
        check_environment(schema.check(compose(overrides)))
