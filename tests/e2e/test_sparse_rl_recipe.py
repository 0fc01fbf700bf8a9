"""Sparse-RL's released recipe: the three experiment files against the values read in the released scripts (typed in
here, never read back from the YAML), and the SimpleRL-Zoo loader on local files of the two record shapes."""

from __future__ import annotations

import json

import pytest

from support.config import compose

ARMS = ("sparse_rl_qwen2_5_3b_rkv", "sparse_rl_qwen2_5_3b_dense", "sparse_rl_qwen2_5_3b_dense_no_tis")
RELEASED = {  # slime/scripts/run-qwen2.5-3b{,-rkv}.sh and slime's defaults, per rank where pods counts per rank (4 ranks)
    "model.path": "Qwen/Qwen2.5-3B",
    "hardware.nproc_per_node": 4,
    "hardware.finetune": "full",
    "hardware.deepspeed.stage": 2,
    "dataset.name": "simplerl_zoo",
    "dataset.train_hub.id": "hkust-nlp/SimpleRL-Zoo-Data",
    "dataset.train_hub.data_dir": "simplelr_qwen_level3to5",
    "dataset.prompt_format": "boxed",
    "dataset.recipe": "correctness",
    "dataset.grader": "boxed",
    "algorithm.n": 8,
    "algorithm.m": 8,
    "algorithm.rule": "all",
    "algorithm.advantage": "grpo",
    "algorithm.policy_loss": "clipped",
    "algorithm.epsilon": 0.2,
    "algorithm.epsilon_high": None,
    "algorithm.beta": 1e-4,
    "algorithm.kl_clamp": 10.0,
    "algorithm.kl_weighted": False,
    "algorithm.loss_agg": "seq_mean",
    "algorithm.ppo_epochs": 1,
    "sampling.temperature": 1.0,
    "sampling.top_p": 1.0,
    "sampling.top_k": -1,
    "sampling.max_tokens": 4096,
    "optim.name": "adamw",
    "optim.lr": 1e-6,
    "optim.schedule": "constant",
    "optim.warmup_ratio": 0.0,
    "optim.betas": [0.9, 0.98],
    "optim.weight_decay": 0.1,
    "optim.max_grad_norm": 1.0,
    "train.max_steps": 100,
    "train.checkpoint_every_steps": 10,
}
CORRECTION = {
    "veto": 1e-4,
    "band_low": 0.5,
    "band_high": 1.5,
    "cap": 1.5,
    "log_ratio_clamp": 20.0,
    "weight_norm": "all",
    "norm_scope": "micro_batch",
}
PER_ARM = {
    "sparse_rl_qwen2_5_3b_rkv": {"rollout.name": "sparse_hf", "algorithm.correction": "sparse_rl", "algorithm.sparse_rl": CORRECTION},
    "sparse_rl_qwen2_5_3b_dense": {"rollout.name": "vllm", "algorithm.correction": "sparse_rl", "algorithm.sparse_rl": CORRECTION},
    "sparse_rl_qwen2_5_3b_dense_no_tis": {"rollout.name": "vllm", "algorithm.correction": "none"},
}


def get(cfg: dict, dotted: str):
    for k in dotted.split("."):
        cfg = cfg[k]
    return cfg


@pytest.mark.parametrize("exp", ARMS)
def test_released_values(exp):
    cfg = compose([f"experiment={exp}"])
    want = {**RELEASED, **PER_ARM[exp]}
    assert {k: get(cfg, k) for k in want} == want
    world = cfg["hardware"]["nproc_per_node"]
    assert cfg["train"]["prompts_per_step"] * world == 128  # --rollout-batch-size 128
    assert cfg["algorithm"]["mini_batch_size"] * world == 256  # --global-batch-size 256
    rollouts = cfg["train"]["prompts_per_step"] * cfg["algorithm"]["n"]
    assert rollouts // cfg["algorithm"]["mini_batch_size"] == 4  # optimizer steps per rollout batch


def test_rkv_compression_as_released():
    """--sglang-compress-max-prompt 512 kept, a compression every 128 decoding steps, R-KV scoring; the sglang-kvc
    defaults: observation window 8, max-pool kernel 7, mix alpha 0.1."""
    r = compose(["experiment=sparse_rl_qwen2_5_3b_rkv"])["rollout"]
    got = (r["method"], r["budget"] - r["interval"], r["interval"], r["window"], r["kernel"], r["mix_alpha"])
    assert got == ("rkv", 512, 128, 8, 7, 0.1)
    # the release's timing (sglang-kvc radix_attention.need_compress / compress): every 128th decode step once
    # the sequence passes 512, never at the prefill, prompt positions scored too, one kept set for every layer
    got = (r["cadence"], r["compress_after"], r["keep_prompt"], r["shared_set"], r["pad"])
    assert got == ("steps", 512, False, True, True)


@pytest.mark.parametrize("exp", ARMS)
def test_recipe_validates(exp):
    """Every name is registered and the schema's rules hold (the model swapped for the tiny one; torchrun's 4 ranks)."""
    import os
    from unittest import mock

    from pods.config import validate

    cfg = compose([f"experiment={exp}"])
    with mock.patch.dict(os.environ, {"WORLD_SIZE": "4"}):
        validate({**cfg, "model": {"name": "tiny", "builder": "tiny", "path": None, "spec": {}}})


# ---- the SimpleRL-Zoo loader --------------------------------------------------------------------------------
def chatml(messages) -> str:
    """Qwen2.5's chat template for a system + user conversation, with the generation prompt."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{{}}."  # the released file's text
RELEASED_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is $1+1$?\n"
    + INSTRUCTION
    + "<|im_end|>\n<|im_start|>assistant\n"
)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_loader_reads_the_released_and_the_hub_records(tmp_path):
    """The released jsonl (a rendered Qwen prompt + label; the Llama copy's list of messages) and the hub's records
    (question + gt_answer) give the bare question and the gold; the ``boxed`` prompt then renders the released chat
    text, except that the released file has the doubled braces of an unformatted template (``\\boxed{{}}``)."""
    from pods.schema import HubDataset, complete
    from pods.tasks import DATASETS

    train = write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"prompt": RELEASED_PROMPT, "label": "2"},
            {
                "prompt": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Find $x$.\n" + INSTRUCTION},
                ],
                "label": "4",
            },
        ],
    )
    hub_shape = write_jsonl(tmp_path / "hub.jsonl", [{"question": "What is $2+1$?", "gt_answer": "3", "level": 3, "subject": "Algebra"}])
    test = write_jsonl(tmp_path / "test.jsonl", [{"problem": "What is $3+3$?", "answer": "6", "solution": "\\boxed{6}"}])
    ds = complete(
        HubDataset, name="simplerl_zoo", recipe="correctness", grader="boxed", prompt_format="boxed", train_files=train, test_files=test
    )
    data = DATASETS.get("simplerl_zoo")(ds)
    assert [(e.messages[1]["content"].split("\n")[0], e.gold) for e in data.train] == [("What is $1+1$?", "2"), ("Find $x$.", "4")]
    assert chatml(data.train[0].messages) == RELEASED_PROMPT.replace("{{}}", "{}")
    assert [(e.messages[1]["content"].split("\n")[0], e.gold) for e in data.test] == [("What is $3+3$?", "6")]
    hub = DATASETS.get("simplerl_zoo")(complete(HubDataset, **{**ds.model_dump(), "train_files": hub_shape}))
    assert hub.train[0].gold == "3" and hub.train[0].messages == data.train[0].messages[:1] + (
        {"role": "user", "content": "What is $2+1$?\nPlease reason step by step, and put your final answer within \\boxed{}."},
    )


def test_loader_names_a_record_without_a_question(tmp_path):
    from pods.schema import HubDataset, complete
    from pods.tasks import DATASETS

    train = write_jsonl(tmp_path / "train.jsonl", [{"label": "2"}])
    ds = complete(HubDataset, name="simplerl_zoo", recipe="correctness", grader="boxed", prompt_format="boxed", train_files=train)
    with pytest.raises(ValueError, match="train record 0.*'question', 'problem' or 'prompt'"):
        DATASETS.get("simplerl_zoo")(ds)


def test_released_reward_is_the_boxed_answer():
    """--rm-type math: 1 if the last \\boxed{} equals the label (mathd normalisation or sympy), else 0."""
    from pods.tasks import GRADERS, RECIPES

    recipe, grade = RECIPES.get("correctness"), GRADERS.get("boxed")
    assert recipe("so the answer is \\boxed{\\frac{1}{2}}", "\\frac12", grade).reward == 1.0
    assert recipe("so the answer is \\boxed{2} or \\boxed{3}", "2", grade).reward == 0.0  # the LAST box counts
    assert recipe("the answer is 2", "2", grade).reward == 0.0  # no box, no credit


@pytest.mark.slow
def test_recipe_algorithm_runs_on_cpu(tiny_dir, tmp_path):
    """The R-KV arm's algorithm, correction and update as committed (mini-batches, unweighted clamped KL, the
    per-micro-batch normaliser), on the tiny model and the toy task with a 24-token R-KV cache: 2 rollout steps of
    2 x 4 rollouts in mini-batches of 4 = 2 optimizer steps each, and the metrics written."""
    from pods.config import validate
    from pods.loop import train
    from pods.metrics import read_metrics
    from support.config import shrink

    over = ["model=tiny", "model.name=tiny", "model.path=null", "hardware=cpu", "dataset=toy_arith", "dataset.max_prompt_length=128"]
    small = [
        "rollout.budget=24",
        "rollout.interval=4",
        "rollout.window=4",
        "rollout.compress_after=24",
        "algorithm.n=4",
        "algorithm.m=4",
        "algorithm.mini_batch_size=4",
    ]
    cfg = shrink(compose(["experiment=sparse_rl_qwen2_5_3b_rkv", *over, *small]), steps=2)
    cfg["eval"]["at_start"] = False
    train(validate(cfg), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert [r["optimizer_steps"] for r in rows] == [2, 2] and all(r["kl"] >= 0 and "sparse_rl_weight_mean" in r for r in rows)
    assert rows[-1]["kv_saving"] > 0


@pytest.mark.slow
def test_sparse_engine_decodes_per_rank_under_zero2(tmp_path):
    """The recipe's layout on 2 gloo ranks: DeepSpeed ZeRO-2 (every rank holds the whole model), each rank decoding
    its own prompts with the compressed-KV engine for as many steps as its rollouts need, the correction and 2
    mini-batches per step (``python -m pods.train`` under torchrun, the tiny model)."""
    from pods.metrics import read_metrics
    from support.harness import torchrun

    args = ["hardware=cpu_ddp2_zero3", "hardware.deepspeed.stage=2", "rollout=sparse_hf", "rollout.budget=24", "rollout.interval=4"]
    args += ["rollout.window=4", "algorithm=grpo", "algorithm.n=4", "algorithm.correction=sparse_rl", "algorithm.mini_batch_size=4"]
    args += ["train.max_steps=2", "train.time_budget_s=null", "train.prompts_per_step=2", "eval.at_start=false", "eval.max_examples=8"]
    args += ["eval.repeats=1", "eval.every_s=null", "sampling.max_tokens=12", f"hydra.run.dir={tmp_path / 'run'}"]
    torchrun(["-m", "pods.train", *args], tmp_path / "torchrun.log", timeout=600)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl", "train")
    assert [(r["optimizer_steps"], r["kept"]) for r in rows] == [(2, 16), (2, 16)] and all(r["kv_saving"] > 0 for r in rows)
