"""Qwen3: the model configs compose with thinking off (through ``python -m pods.train``), their architectures give the
published parameter counts and transformers' own count (q/k norms included), ``python -m pods.memory`` estimates
them, and ``model.chat_template_kwargs`` reaches the chat template (the tiny Qwen3's has Qwen3's switch)."""

from __future__ import annotations

import pytest

from pods.architectures import ARCHITECTURES, parameter_count
from support.doors import door

# The model cards (hub README "Number of Parameters" and "(Non-Embedding)"), as rounded there.
PUBLISHED = {
    "Qwen/Qwen3-0.6B": ("0.6", "0.44"),
    "Qwen/Qwen3-1.7B": ("1.7", "1.4"),
    "Qwen/Qwen3-4B": ("4.0", "3.6"),
    "Qwen/Qwen3-8B": ("8.2", "6.95"),
}
CONFIGS = {"qwen3_0_6b": "Qwen/Qwen3-0.6B", "qwen3_1_7b": "Qwen/Qwen3-1.7B", "qwen3_4b": "Qwen/Qwen3-4B", "qwen3_8b": "Qwen/Qwen3-8B"}


def billions(count: int, like: str) -> str:
    """``count`` in billions, rounded to the decimals of ``like``."""
    return f"{count / 1e9:.{len(like.split('.')[1])}f}"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_are_the_published_ones_and_transformers(name):
    """Rounded as the model card rounds them: total and non-embedding (the embedding counted once when tied, the head
    apart when not, as the cards count). Exactly: transformers' Qwen3ForCausalLM of the row on the meta device, whose
    q_norm and k_norm (head_dim weights each per layer) the count must include."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    arch = ARCHITECTURES[name]
    total, non_embedding = PUBLISHED[name]
    count = parameter_count(arch)
    embedding = arch["vocab_size"] * arch["hidden_size"] * (1 if arch["tie_word_embeddings"] else 2)
    assert (billions(count, total), billions(count - embedding, non_embedding)) == (total, non_embedding)
    fields = {k: v for k, v in arch.items() if k not in ("architectures", "model_type", "torch_dtype", "rope_theta")}
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**fields))
    assert sum(p.numel() for p in model.parameters()) == count


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_each_qwen3_config_composes_with_thinking_off(config):
    from pods.compose import compose

    cfg = compose([f"model={config}"], rules=False)
    assert cfg.model.path == CONFIGS[config] and cfg.model.chat_template_kwargs == {"enable_thinking": False}


def test_pods_train_composes_qwen3_4b_with_thinking_off_and_the_switch_turns_it_on():
    off = door("pods.train", ["--cfg", "job", "model=qwen3_4b"])
    on = door("pods.train", ["--cfg", "job", "model=qwen3_4b", "model.chat_template_kwargs.enable_thinking=true"])
    assert off.returncode == on.returncode == 0, off.stderr[-2000:] + on.stderr[-2000:]
    assert "path: Qwen/Qwen3-4B" in off.stdout and "enable_thinking: false" in off.stdout
    assert "enable_thinking: true" in on.stdout


def test_chat_template_kwargs_that_are_not_a_mapping_fail_in_one_line(tmp_path):
    p = door("pods.train", ["model=qwen3_4b", "model.chat_template_kwargs=3", f"hydra.run.dir={tmp_path / 'run'}"])
    assert p.returncode == 2 and "model.chat_template_kwargs" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "run").exists()


def test_pods_memory_estimates_qwen3_4b():
    """8 H100s, ZeRO-3: the weights line is the architecture's count (q/k norms in) over the 8 ranks, in bf16."""
    p = door("pods.memory", ["model=qwen3_4b", "hardware=h100x8_zero3", "rollout=vllm"])
    assert p.returncode == 0, p.stderr[-2000:]
    count = parameter_count(ARCHITECTURES["Qwen/Qwen3-4B"])
    assert "Qwen/Qwen3-4B on h100x8_zero3 (vllm)" in p.stdout and ": fits" in p.stdout
    assert f"vLLM weights                           {2 * count / 1e9:.2f} GB  {count / 1e9:.2f}B x 2 B" in p.stdout


def test_the_estimate_counts_qwen3s_qk_norm_activations():
    """A Qwen3 layer keeps more for backward than a Qwen2 layer of the same widths (the q/k norms' fp32 inputs and
    1/rms, their outputs when trained); the exact bytes: tests/unit/test_memory.py."""
    from pods.memory.update import layer_saved_bytes

    qwen3 = ARCHITECTURES["Qwen/Qwen3-1.7B"]  # heads x head_dim = hidden: only the norms differ
    qwen2 = {**qwen3, "model_type": "qwen2"}
    q, kv, heads = 16 * 128, 8 * 128, 16 + 8
    assert layer_saved_bytes(qwen3, 2, True, None) - layer_saved_bytes(qwen2, 2, True, None) == 4 * (q + kv) + 4 * heads + 2 * (q + kv)


def test_the_tiny_qwen3_template_has_qwens_thinking_switch():
    """The shipped tiny Qwen3 (q/k norms, explicit head_dim): ``enable_thinking=false`` opens the answer with an empty
    think block, nothing (the default) leaves the generation prompt as it is; ``encode_prompts`` passes the kwargs."""
    import json

    from pods.models import load_tokenizer, resolve_model_dir
    from pods.schema import Model
    from pods.tasks import DATASETS, encode_prompts
    from pods.tiny import ASSETS, dataset_section

    model = Model.of(
        {"name": "tiny_qwen3", "builder": "tiny", "spec": {"architecture": "qwen3"}, "chat_template_kwargs": {"enable_thinking": False}}
    )
    path = resolve_model_dir(model)
    assert str(path).startswith(str(ASSETS))  # shipped: no build here
    config = json.loads((__import__("pathlib").Path(path) / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["head_dim"] == 32
    tok = load_tokenizer(path)
    examples = DATASETS.get("toy_arith")(dataset_section()).test[:3]
    off, _, _ = encode_prompts(examples, tok, None, {"enable_thinking": False})
    plain, _, _ = encode_prompts(examples, tok, None)
    think = tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert all(a == b + think for a, b in zip(off, plain)) and tok.convert_tokens_to_ids("</think>") in think
