"""TRL's synchronous GRPOTrainer on pods' work, for ``bench_async.py`` (run as a child process, TRL on its path).

Run: ``PYTHONPATH=<trl prefix>:. python benchmarks/_trl_grpo.py STEPS THREADS OUT.json``. The same tiny model and
tokenizer (``pods.tiny``), the same toy-task prompts (their chat messages: TRL applies the same template), the same
reward (``pods.tasks.score_batch`` with the dataset's recipe, grader and grading timeout), n = 16 completions of at
most 16 tokens for one prompt per step at T = 1 (no top-k/top-p), one optimizer step per generation
(``steps_per_generation=1``), ``loss_type=grpo`` (per-sequence token mean, as pods' ``seq_mean``), no KL, no
gradient checkpointing (TRL turns it on by default; pods' CPU profile has it off), pods' learning rate. Writes each
optimizer step's wall time (``on_step_end`` to ``on_step_end``: generation, scoring, forward, backward, AdamW) and
TRL's mean completion length to OUT.json. TRL is not a dependency of pods: it lives in a separate prefix.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

STEPS, THREADS, OUT = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
os.environ["OMP_NUM_THREADS"] = str(THREADS)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import typed  # noqa: E402  (the repository on sys.path, the CPU numerics pinned)

N, MAX_TOKENS = 16, 16


def main() -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pods.models import load_tokenizer
    from pods.tasks import DATASETS, score_batch
    from pods.tiny import ensure_tiny

    torch.set_num_threads(THREADS)
    cfg = typed(["algorithm=grpo", f"sampling.max_tokens={MAX_TOKENS}"])
    ds = cfg.dataset
    task = DATASETS.get(ds.name)(ds)
    records = [{"prompt": list(ex.messages), "gold": ex.gold} for ex in task.train]
    model_dir = ensure_tiny()
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def reward(completions, gold, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [s.reward for s in score_batch(texts, list(gold), ds.recipe, ds.grader, timeout_s=ds.grade_timeout_s)]

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, max_steps=STEPS, per_device_train_batch_size=N, num_generations=N, steps_per_generation=1,
            gradient_accumulation_steps=1, max_completion_length=MAX_TOKENS, temperature=cfg.sampling.temperature,
            top_k=0, top_p=1.0, beta=0.0, loss_type="grpo", learning_rate=cfg.optim.lr, gradient_checkpointing=False,
            use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
            seed=cfg.seed, dataloader_num_workers=0, log_completions=False,
        )  # fmt: skip
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(records), processing_class=tok)
        trainer.add_callback(Clock())
        trainer.train()
        lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    steps = [b - a for a, b in zip(ends, ends[1:])]
    OUT.write_text(json.dumps({"step_s": steps, "mean_length": sum(lengths) / max(len(lengths), 1)}))


if __name__ == "__main__":
    main()
