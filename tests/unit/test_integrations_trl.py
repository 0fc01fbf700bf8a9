"""``pods.integrations.trl`` on TRL 1.16's real ``GRPOTrainer`` with the tiny model: the hook keeps m of each group's n
completions (the max-variance choice exact against brute force over the rewards TRL computed), advantages over the
kept rows, TRL's token normaliser over them; bad settings refused before a model loads; another TRL release refused
on import in one line. Skipped, saying so, where ``pods[trl]`` is not installed (``make install`` installs it)."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install 'pods[trl]' (make install installs it)")

from pods.errors import ConfigError  # noqa: E402
from pods.integrations import kept  # noqa: E402

N, M = 8, 3


def config(tmp_path, **over):
    from trl import GRPOConfig

    values = dict(
        output_dir=str(tmp_path), max_steps=1, num_generations=N, per_device_train_batch_size=N, gradient_accumulation_steps=2,
        max_completion_length=8, learning_rate=1e-4, beta=0.0, loss_type="grpo", use_cpu=True, bf16=False, report_to=[],
        save_strategy="no", disable_tqdm=True, log_completions=False, gradient_checkpointing=False, seed=0, top_k=0,
    )  # fmt: skip
    return GRPOConfig(**{**values, **over})


@pytest.fixture(scope="module")
def trainer(tiny_dir, tmp_path_factory):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from pods.integrations.trl import PodsGRPOTrainer, task_dataset, task_reward
    from pods.schema import ToyDataset
    from pods.tasks import DATASETS
    from pods.tiny import load_tokenizer

    task = DATASETS.get("toy_arith")(ToyDataset(name="toy_arith", recipe="toy", grader="toy"))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    return PodsGRPOTrainer(
        model, task_reward("toy", "toy"), config(tmp_path_factory.mktemp("trl")), m=M,
        train_dataset=Dataset.from_list(task_dataset(task.train[:16])), processing_class=load_tokenizer(tiny_dir),
    )  # fmt: skip


def test_the_hook_trains_the_max_variance_m_of_each_group(trainer, monkeypatch):
    """Two prompts x 8 completions generated and scored by TRL; the batch TRL's loss gets is the 2 x 3 kept rows."""
    from trl import GRPOTrainer

    seen = {}
    full_batch = GRPOTrainer._generate_and_score_completions
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, x: seen.setdefault("full", full_batch(self, x)))
    take = kept.take
    monkeypatch.setattr(kept, "take", lambda batch, rows, size: take(batch, seen.setdefault("rows", rows), size))
    inputs = [row for row in trainer.train_dataset.select(range(2)) for _ in range(N)]  # the sampler's layout: n in a row
    trainer.model.train()
    torch.manual_seed(3)
    out = trainer._generate_and_score_completions(inputs)

    full, rows = seen["full"], seen["rows"]
    rewards = trainer._pods_rewards.sum(dim=1)  # one reward function, weight 1
    assert out["completion_ids"].shape[0] == 2 * M and out["advantages"].shape == (2 * M,)
    for g in range(2):
        mine = rows[g * M : (g + 1) * M]
        assert torch.all((mine >= g * N) & (mine < (g + 1) * N))
        group = rewards[g * N : (g + 1) * N].double()
        best = max(group[list(c)].var(unbiased=False).item() for c in itertools.combinations(range(N), M))
        assert rewards[mine].double().var(unbiased=False).item() == pytest.approx(best, abs=1e-12)
        r = rewards[mine]
        assert torch.allclose(out["advantages"][g * M : (g + 1) * M], (r - r.mean()) / (r.std() + 1e-4), atol=1e-6)
    assert torch.equal(out["completion_ids"], full["completion_ids"][rows])
    assert torch.equal(out["prompt_ids"], full["prompt_ids"][rows])
    assert out["num_items_in_batch"].item() == full["completion_mask"][rows].sum().item() < full["num_items_in_batch"].item()


def test_bad_settings_are_refused_before_the_model_loads(tmp_path):
    """A model path that does not exist: the refusal comes first, in one line."""
    from pods.integrations.trl import PodsGRPOTrainer, task_reward

    cases = [
        (config(tmp_path), dict(m=N + 1), "1..n = 8"),
        (config(tmp_path), dict(m=2, rule="d3s_cross"), "picks across groups"),
        (config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=4), dict(m=M), "equal micro-batches"),
        (config(tmp_path, multi_objective_aggregation="normalize_then_sum"), dict(m=2), "sum_then_normalize"),
    ]
    for args, kw, says in cases:
        with pytest.raises(ConfigError, match=says) as e:
            PodsGRPOTrainer(str(tmp_path / "no-such-model"), task_reward("toy", "toy"), args, **kw)
        assert "\n" not in str(e.value)


def test_another_trl_release_is_refused_on_import_in_one_line(monkeypatch):
    """Installed (read from its metadata on import) or imported (``trl.__version__``, when the class is defined)."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.17.0" if name == "trl" else real(name))
    monkeypatch.delitem(sys.modules, "pods.integrations.trl", raising=False)
    with pytest.raises(ImportError) as e:
        importlib.import_module("pods.integrations.trl")
    assert str(e.value) == "pods.integrations.trl needs trl==1.16.0 (pip install 'pods[trl]'), found trl 1.17.0"
    monkeypatch.undo()

    from pods.integrations.trl import trainer_class

    monkeypatch.setattr(trl, "__version__", "1.15.0")
    with pytest.raises(ImportError, match="found trl 1.15.0$"):
        trainer_class()
