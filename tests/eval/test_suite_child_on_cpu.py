"""The end-of-run suite's engine (``eval.suite``; in a clean process after several ranks or with vLLM): a vLLM engine
gets the suite's longest sequence as ``max_model_len`` (not the model's whole context: 131k tokens for Llama-3.1-8B)
and the profile's share of a GPU it has alone (``hardware.vllm_alone_share``, not vLLM's default 0.5); and the
trainer's engines, backend and policy are gone (weak references dead) before the suite loads a model, on CUDA a
refusal in one line if not. The vLLM engine itself is not started here (its section is: the settings it is given)."""

from __future__ import annotations

import gc

import pytest

from support.doors import door
from support.runs import TINY_STEPS

SUITE = ["eval.suite=toy", "eval.suite_overrides=['suite.only=[toy_arith]','suite.benchmarks.toy_arith.size=4','suite.samples=1']"]


def root(overrides: list[str]):
    from pods.compose import compose_plain
    from pods.schema import check

    return check(compose_plain(overrides))


def test_the_suites_vllm_gets_its_longest_sequence_and_the_profiles_share():
    from pods.eval.benchmarks import compose_suite
    from pods.eval.end import options
    from pods.eval.run import engine_settings
    from pods.schema.rollouts import HfRollout, VllmRollout

    cfg = root(["hardware=l40s_lora", "rollout=hf", "eval.suite=toy", "eval.suite_engine=vllm", "hardware.vllm_alone_share=0.9"])
    bench = compose_suite(
        "toy", ["suite.max_prompt_length=300", "suite.max_tokens=200", "+suite.per_benchmark={toy_long: {max_tokens: 700}}"]
    )
    how = options(cfg, bench)
    assert (how.engine, how.device, how.max_model_len, how.gpu_memory_utilization) == ("vllm", "cuda", 1000, 0.9)
    vllm, hf = type("Vllm", (), {"section": VllmRollout}), type("Hf", (), {"section": HfRollout})
    given = engine_settings(vllm, how, context=None)
    assert (given["max_model_len"], given["gpu_memory_utilization"], given["dtype"]) == (1000, 0.9, "bfloat16")
    assert set(engine_settings(hf, how, context=None)) == {"name", "max_batch"}
    assert options(root(["eval.suite=toy", "eval.suite_engine=vllm"])).gpu_memory_utilization == 0.85  # the default share
    hf = options(root(["eval.suite=toy"]))  # HF sizes no cache: nothing to record
    assert (hf.max_model_len, hf.gpu_memory_utilization) == (None, None)


def test_without_a_prompt_bound_the_length_is_the_longest_prompt_plus_the_largest_completion(tiny_dir):
    from pods.eval.benchmarks import compose_suite
    from pods.eval.run import context_length, load_suite
    from pods.models import load_tokenizer
    from pods.tasks import encode_prompts

    suite = compose_suite("toy", ["suite.max_tokens=40"])
    assert suite.max_prompt_length is None
    data, tok = load_suite(suite, "pods_instruct"), load_tokenizer(str(tiny_dir))
    longest = max(len(ids) for examples in data.values() for ids in encode_prompts(examples, tok, None)[0])
    assert longest > 10 and context_length(suite, data, tok) == longest + 40


def test_a_live_trainer_engine_is_named_and_refused_on_cuda():
    from pods.engines.base import alive, remember
    from pods.eval.end import trainer_gone

    class Engine:
        pass

    held = Engine()
    remember(engine=held, policy=None)
    assert "engine" in alive()
    with pytest.raises(RuntimeError, match=r"^the trainer's engine still alive after training: its memory is not given back"):
        trainer_gone("cuda")
    trainer_gone("cpu")  # a warning only
    del held
    gc.collect()
    assert alive() == []
    trainer_gone("cuda")


@pytest.mark.parametrize("staleness", [0, 1])  # 1: the producer thread's frozen copy of the policy too
def test_after_a_real_run_the_trainers_engines_are_dead_before_the_suite(monkeypatch, tmp_path, staleness):
    import pods.engines.base

    seen, real = [], pods.engines.base.alive

    def spy() -> list[str]:
        seen.append(real())
        return seen[-1]

    monkeypatch.setattr(pods.engines.base, "alive", spy)
    p = door(
        "pods.train",
        [
            *TINY_STEPS,
            "train.max_steps=1",
            "train.prompts_per_step=1",
            f"train.max_staleness={staleness}",
            *SUITE,
            f"hydra.run.dir={tmp_path}",
        ],
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert seen == [[]]  # asked once, at the end, and the engine, backend and policy were gone
    assert (tmp_path / "eval" / "toy" / "summary.json").is_file()
