"""The tiny model: loads through from_pretrained, tokenizers agree, warm start lands mid-range."""

from __future__ import annotations

import json

import torch

from pods.engines import ENGINES, Sampling
from pods.eval.accuracy import evaluate
from pods.models import load_policy, load_tokenizer
from pods.schema import Hardware, HfRollout, ToyDataset, complete
from pods.tasks import DATASETS, encode_prompts
from pods.tiny import DEFAULT_SPEC, dataset_section
from support.harness import max_gap, within


def test_tokenizer_round_trip_and_auto_tokenizer_agree(tiny_dir):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = load_tokenizer(str(tiny_dir))
    assert isinstance(tok, PreTrainedTokenizerFast)
    auto = AutoTokenizer.from_pretrained(str(tiny_dir))  # what vLLM and other tools will load
    data = DATASETS.get("toy_arith")(dataset_section())
    ids, kept, dropped = encode_prompts(data.test[:50], tok, 128)
    auto_ids, _, _ = encode_prompts(data.test[:50], auto, 128)
    assert ids == auto_ids and dropped == 0
    text = "Answer: 1234 + 56 = 1290"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_model_config_is_vllm_compatible(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["hidden_size"] // cfg["num_attention_heads"] >= 32
    info = json.loads((tiny_dir / "pods_tiny.json").read_text())
    assert 100_000 < info["params"] < 2_000_000


def test_warm_start_accuracy_is_well_inside_0_and_1(tiny_dir):
    tok = load_tokenizer(str(tiny_dir))
    model = load_policy(str(tiny_dir), complete(Hardware, name="cpu", dtype="float32"))
    engine = ENGINES.get("hf")(str(tiny_dir), tok, complete(HfRollout, name="hf"), policy=model)
    data = DATASETS.get("toy_arith")(dataset_section())
    ids, kept, _ = encode_prompts(data.test[:100], tok, 128)
    from pods.schema import Eval

    ev = complete(Eval, temperature=1.0, max_tokens=12, repeats=2)
    ds = complete(ToyDataset, name="toy_arith", recipe="toy", grader="toy")
    res = evaluate(engine, ids, [e.gold for e in kept], ev, ds, seed=0)
    assert 0.05 < res["accuracy"] < 0.85, res  # label-smoothed warm start: sampled answers often carry a stray token
    assert res["format_accuracy"] > 0.05
    greedy = evaluate(engine, ids, [e.gold for e in kept], complete(Eval, ev, temperature=0.0, repeats=1), ds, seed=0)
    # the warm start must be past the step where addition is learnt (400 steps gave 0.97 on one machine, 0.10 on another)
    assert greedy["accuracy"] > 0.9, greedy


def test_hf_engine_logprobs_match_a_fresh_forward(tiny_dir):
    """The engine's sampler log-probs equal the policy's recomputed log-probs at the same temperature."""
    from pods.backends.base import build_batch
    from pods.losses import token_logprobs

    tok = load_tokenizer(str(tiny_dir))
    model = load_policy(str(tiny_dir), complete(Hardware, name="cpu", dtype="float32")).eval()
    engine = ENGINES.get("hf")(str(tiny_dir), tok, complete(HfRollout, name="hf"), policy=model)
    data = DATASETS.get("toy_arith")(dataset_section())
    ids, _, _ = encode_prompts(data.test[:3], tok, 128)
    torch.manual_seed(0)
    ro = engine.generate(ids, 4, Sampling(temperature=0.7, max_tokens=12))
    b = build_batch([ids[i // 4] for i in range(12)], ro.completion_ids, ro.logprobs, torch.zeros(12), tok.pad_token_id)
    pos = (b.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=pos).logits
    P = b.prompt_width
    lp = token_logprobs(logits[:, P - 1 : -1], b.input_ids[:, P:], 0.7)
    within(max_gap(lp * b.loss_mask, b.sampler_logprobs), 1e-4, "HF engine log-probs vs a fresh forward")
    assert all(r in ("stop", "length") for r in ro.finish_reasons)
    assert all(len(c) == len(lp_) for c, lp_ in zip(ro.completion_ids, ro.logprobs))


def test_hf_engine_greedy_with_n_repeats_and_ignores_the_models_generation_config(tiny_dir):
    tok = load_tokenizer(str(tiny_dir))
    model = load_policy(str(tiny_dir), complete(Hardware, name="cpu", dtype="float32")).eval()
    model.generation_config.repetition_penalty = 5.0  # must not leak into the engine's sampling
    engine = ENGINES.get("hf")(str(tiny_dir), tok, complete(HfRollout, name="hf"), policy=model)
    data = DATASETS.get("toy_arith")(dataset_section())
    ids, _, _ = encode_prompts(data.test[:2], tok, 128)
    ro = engine.generate(ids, 3, Sampling(temperature=0.0, max_tokens=8))
    assert ro.completion_ids[0] == ro.completion_ids[1] == ro.completion_ids[2]
    with torch.no_grad():  # greedy = argmax of the plain model at every step
        seq = ids[0] + ro.completion_ids[0]
        logits = model(input_ids=torch.tensor([seq])).logits[0, len(ids[0]) - 1 : -1]
    assert logits.argmax(-1).tolist() == ro.completion_ids[0]


def test_every_tiny_model_a_committed_config_uses_is_shipped():
    """Compose the default config and every experiment; each tiny-model spec must have its asset in pods/assets/."""
    import importlib.util
    from pathlib import Path

    from pods.tiny import ASSETS, SHIPPED_FILES

    path = Path(__file__).resolve().parents[2] / "scripts" / "tiny_model.py"
    spec = importlib.util.spec_from_file_location("tiny_model", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    used = script.committed_specs()
    assert "tiny-" + __import__("pods.tiny").tiny.spec_hash(DEFAULT_SPEC) in used and len(used) >= 2  # the toy task's, toy_long's
    missing = [name for name in used if not all((ASSETS / name / f).is_file() for f in SHIPPED_FILES)]
    assert not missing, f"not shipped: {missing}; build and ship them with `python scripts/tiny_model.py --ship`"
    for name, full in used.items():  # the shipped asset is the spec it is named after, built with the pinned numerics
        info = json.loads((ASSETS / name / "pods_tiny.json").read_text())
        assert info["spec"] == full and info["numerics"]["torch_cpu_capability"] == "AVX2", name


def test_ensure_tiny_loads_the_shipped_model_and_writes_nothing(tmp_path):
    from pods.models import resolve_model_dir
    from pods.schema import Model
    from pods.tiny import ASSETS, ensure_tiny

    got = ensure_tiny({}, tmp_path)
    assert got.parent == ASSETS and list(tmp_path.iterdir()) == []
    assert resolve_model_dir(Model(name="tiny", builder="tiny", cache_dir=str(tmp_path))) == str(got)


def test_a_build_that_loses_the_race_to_a_concurrent_one_returns_and_cleans_up(tmp_path):
    """Two processes building the same key: the second rename finds the winner's directory (OSError); the loser
    keeps the winner's model and leaves no ``.tmp<pid>``; a dead process's leftover is removed on the next call."""
    from pods.tiny import _drop_stale_builds, _publish, load_tokenizer, shipped

    src = shipped({})
    tok, model = load_tokenizer(src), load_policy(str(src), complete(Hardware, name="cpu", dtype="float32"))
    out = tmp_path / "tiny-x"
    _publish(model, tok, {"who": "winner"}, out)
    _publish(model, tok, {"who": "loser"}, out)  # rename onto a non-empty directory: OSError, tolerated
    assert json.loads((out / "pods_tiny.json").read_text()) == {"who": "winner"}
    stale = tmp_path / "tiny-x.tmp999999999"  # no such process
    stale.mkdir()
    _drop_stale_builds(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-x"]
