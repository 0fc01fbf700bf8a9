"""Rollout engines by name. Heavy engines are registered lazily, so ``import pods`` never imports vLLM."""

from pods.engines.base import ENGINES, Engine, EngineSpec, Rollouts, Sampling

ENGINES.register_lazy("hf", "pods.engines.hf:HFEngine")
ENGINES.register_lazy("vllm", "pods.engines.vllm:VLLMEngine", spec=EngineSpec(package="vllm"))
ENGINES.register_lazy(
    "vllm_server", "pods.engines.vllm_server:VLLMServerEngine", spec=EngineSpec(package="vllm")
)  # K `vllm serve` processes
ENGINES.register_lazy("sparse_hf", "pods.engines.sparse_hf:SparseHFEngine")  # compressed-KV rollouts (Sparse-RL)

__all__ = ["ENGINES", "Engine", "EngineSpec", "Rollouts", "Sampling"]
