"""The HF generate engine's sampler log-probs, taken step by step by its logits processor (one [B, V] log-softmax
alive at a time, instead of every step's logits), against an independent recomputation."""

from __future__ import annotations

import pytest
import torch

from pods.engines import ENGINES, Sampling
from pods.models import load_tokenizer
from pods.schema import HfRollout, complete
from support.harness import max_gap, within


@pytest.fixture(scope="module")
def model_tok(tiny_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval(), load_tokenizer(str(tiny_dir))


def _prompts(tok) -> list[list[int]]:
    msgs = [
        [{"role": "user", "content": f"What is {a} + {b}? Answer in format: 'Answer: {{result}}'"}] for a, b in ((12, 7), (38, 45), (9, 91))
    ]
    return [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)) for m in msgs]


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=0.0, max_tokens=12),
        Sampling(temperature=1.0, max_tokens=12, seed=4),
        Sampling(temperature=0.7, max_tokens=12, top_k=5, top_p=0.9, seed=3),
    ],
    ids=["greedy", "t1", "t0.7_topk5_topp0.9"],
)
def test_sampled_tokens_and_logprobs_equal_generate_with_every_steps_logits(model_tok, tiny_dir, sampling):
    """Reference: transformers' own sampling (its temperature, top-k and top-p warpers) with ``output_logits``, same
    seed: the engine draws the same tokens, and each log-prob is log_softmax(raw logits / T) at the drawn token (the
    trainer's: no top-k/top-p renormalisation) to 1e-5."""
    from transformers import GenerationConfig

    model, tok = model_tok
    prompts = _prompts(tok)
    engine = ENGINES.get("hf")(tiny_dir, tok, complete(HfRollout, name="hf"), policy=model)
    ro = engine.generate(prompts, 4, sampling)
    assert max(map(len, ro.completion_ids)) > 4  # completions long enough that step t - 1's bookkeeping matters

    rows = [p for p in prompts for _ in range(4)]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in rows])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    greedy = sampling.temperature <= 0
    warp = {} if greedy else dict(temperature=sampling.temperature, top_k=max(sampling.top_k, 0), top_p=sampling.top_p)
    config = GenerationConfig(do_sample=not greedy, max_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=sorted(engine.stop_ids),
                              return_dict_in_generate=True, output_logits=True, **warp)  # fmt: skip
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    saved, model.generation_config = model.generation_config, GenerationConfig()
    try:
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    finally:
        model.generation_config = saved
    new = gen.sequences[:, width:]
    logits = torch.stack(gen.logits, dim=1).float() / (1.0 if greedy else sampling.temperature)
    ref_lp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    for i, (c, lp) in enumerate(zip(ro.completion_ids, ro.logprobs)):
        assert c == new[i, : len(c)].tolist()
        within(max_gap(torch.tensor(lp), ref_lp[i, : len(c)]), 1e-5, "HF engine vs generate() scores")
