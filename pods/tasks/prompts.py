"""Prompt formats, by name (``dataset.prompt_format``): question -> (chat messages, raw prompt text).

The wording is the experimental setting being reproduced, so the three strings are the authors':
- ``pods_instruct``: their single-GPU prompt for instruct models (system turn + the raw question as the
  user turn, rendered by the tokenizer's chat template).
- ``pods_base``: their base-model prompt, raw text (``Example.prompt_text``), no chat template.
- ``open_r1``: the system prompt of their multi-GPU open-r1 recipe (Qwen2.5-3B-Instruct config).
- ``question``: the bare question as the only user turn (no format instructions).
- ``boxed``: the Qwen / SimpleRL-Zoo chat prompt that asks for ``\\boxed{}`` (system "You are a helpful assistant.",
  the question then the step-by-step instruction as the user turn): Sparse-RL's training and evaluation prompt.
"""

from __future__ import annotations

from pods.registry import Registry

PROMPTS = Registry("prompt format")

PODS_INSTRUCT_SYSTEM = """
You will be given a math question.
Reason about the question and correct your own mistakes if you make any.

Respond in the following format:
<think>
Reason here. Decide to answer when you are confident as your response length is limited.
</think>
<answer>
Answer here.
</answer>
"""

PODS_BASE_PREFIX = """
An AI assistant is given a math problem and solves it step by step. The assistant first thinks about the reasoning process in the mind and then concludes the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., 
<think>
Reasoning
</think>
<answer>
Answer
</answer>
"""

OPEN_R1_SYSTEM = (
    "You are a helpful AI Assistant that provides well-reasoned and detailed responses. You first think about "
    "the reasoning process as an internal monologue and then provide the user with the answer. Respond in the "
    "following format: <think>\n...\n</think>\n<answer>\n...\n</answer>"
)

BOXED_SYSTEM = "You are a helpful assistant."
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

Prompt = tuple  # (messages: tuple[dict, ...], prompt_text: str | None)


@PROMPTS.register("pods_instruct")
def pods_instruct(question: str) -> Prompt:
    return ({"role": "system", "content": PODS_INSTRUCT_SYSTEM}, {"role": "user", "content": question}), None


@PROMPTS.register("pods_base")
def pods_base(question: str) -> Prompt:
    return ({"role": "user", "content": question},), PODS_BASE_PREFIX + "Problem: " + question + "\nSolution: "


@PROMPTS.register("open_r1")
def open_r1(question: str) -> Prompt:
    return ({"role": "system", "content": OPEN_R1_SYSTEM}, {"role": "user", "content": question}), None


@PROMPTS.register("question")
def bare_question(question: str) -> Prompt:
    return ({"role": "user", "content": question},), None


@PROMPTS.register("boxed")
def boxed(question: str) -> Prompt:
    return ({"role": "system", "content": BOXED_SYSTEM}, {"role": "user", "content": question + "\n" + BOXED_INSTRUCTION}), None
