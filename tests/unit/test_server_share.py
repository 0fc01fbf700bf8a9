"""What a vLLM server that has its GPU to itself asks of it: the profile's share, not vLLM's default half."""

from __future__ import annotations


def test_a_server_on_a_gpu_of_its_own_takes_the_profiles_share():
    """A launched vLLM server owns its GPU (``rollout.devices``): its ``--gpu-memory-utilization`` is the profile's
    ``hardware.vllm_alone_share`` (0.85), not vLLM's 0.5; on CPU its KV cache is sized in bytes, as before."""
    from pods.compose import compose
    from pods.engines.server_procs import server_argv

    ro = compose(["hardware=l40s_lora", "rollout=vllm_server", "rollout.devices=[1]"], rules=False).rollout
    argv = server_argv("/models/m", ro, 8000, on_cpu=False, transport="nccl")
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.85"
    cpu = server_argv("/models/m", compose(["rollout=vllm_server"], rules=False).rollout, 8000, on_cpu=True, transport="gloo")
    assert "--gpu-memory-utilization" not in cpu and "--kv-cache-memory-bytes" in cpu
