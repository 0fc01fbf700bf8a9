"""PODS inside TRL's ``GRPOTrainer`` (TRL 1.16.0 only: ``pip install 'pods[trl]'``; docs/integrations.md).

``PodsGRPOTrainer`` is TRL's trainer with TRL's own config (``GRPOConfig``): it generates ``num_generations`` = n
completions per prompt and scores them as TRL does, then keeps m per prompt group by a PODS rule
(``pods.downsample``: ``max_variance``, ``max_reward``, ``random``; D3S's sample level is ``d3s_intra`` with
``advantage_scope="group"``), computes the advantages over the kept rollouts (``pods.integrations.kept``), and hands
TRL's loss only the kept rows. The hook is one override of ``_generate_and_score_completions``: its output dict is
cut to the kept rows before TRL shuffles it and splits it into ``steps_per_generation`` micro-batches; the
rewards are the ones TRL computed (``_calculate_rewards``, kept aside), weighted by ``reward_weights`` and summed.

What TRL computes before the cut runs on all n (reference-model log-probs with ``beta > 0``, old log-probs when
they are needed, TRL's logged reward and advantage statistics); the loss, its token normaliser
(``num_items_in_batch``) and the update see only the kept rows. Each process's generation batch must hold whole
groups (``per_device_train_batch_size * steps_per_generation`` a multiple of n), so each process selects alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

import torch

from pods.errors import need
from pods.integrations import kept

if TYPE_CHECKING:
    from trl import GRPOConfig

TRL_VERSION = "1.16.0"


def check_version(found: str) -> None:
    """An ``ImportError`` in one line unless ``found`` is the TRL release this module was written against."""
    if found != TRL_VERSION:
        raise ImportError(f"pods.integrations.trl needs trl=={TRL_VERSION} (pip install 'pods[trl]'), found trl {found}")


try:  # the installed release, read without importing trl (importing it sets variables and loads vLLM, wandb...)
    check_version(version("trl"))
except PackageNotFoundError:
    raise ModuleNotFoundError(f"pods.integrations.trl needs trl=={TRL_VERSION}: pip install 'pods[trl]'", name="trl") from None


def __getattr__(name: str):
    """``PodsGRPOTrainer`` is defined on first use: it subclasses TRL's trainer, which is imported then."""
    if name != "PodsGRPOTrainer":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = trainer_class()
    return globals()[name]


def check_config(args: GRPOConfig, m: int, rule: str, scope: str) -> None:
    """The PODS settings against TRL's config: ``ConfigError`` in one line, before the model loads."""
    n = args.num_generations
    kept.check(n, m, rule, scope, args.scale_rewards)
    need(
        args.multi_objective_aggregation == "sum_then_normalize",
        "PODS selects on the summed reward: multi_objective_aggregation must be 'sum_then_normalize'",
    )
    local = args.per_device_train_batch_size * args.steps_per_generation
    need(
        local % n == 0,
        f"PODS needs whole groups per process: per_device_train_batch_size * steps_per_generation = {local} is not a multiple of num_generations = {n}",
    )
    need(
        (local // n * m) % args.steps_per_generation == 0,
        f"the {local // n * m} kept rows do not split into steps_per_generation = {args.steps_per_generation} equal micro-batches",
    )


def trainer_class() -> type:
    """``PodsGRPOTrainer``, defined against the imported TRL (its version checked again: the one imported can differ from
    the one installed, e.g. a ``PYTHONPATH`` prefix)."""
    import trl
    from trl import GRPOTrainer

    check_version(trl.__version__)

    class PodsGRPOTrainer(GRPOTrainer):
        """``GRPOTrainer`` that trains on m of each prompt's n completions (``args.num_generations`` = n).

        ``m``: completions kept per prompt; ``rule``: a per-group rule of ``pods.downsample.RULES``; ``advantage_scope``:
        ``kept`` (PODS: advantages over the kept m, with TRL's ``scale_rewards``) or ``group`` (the full group's
        advantages as TRL computed them, not re-normalised: D3S with ``rule="d3s_intra"``). Every other argument is
        ``GRPOTrainer``'s."""

        def __init__(
            self, model, reward_funcs, args: GRPOConfig, *, m: int, rule: str = "max_variance", advantage_scope: str = "kept", **kw
        ):
            check_config(args, m, rule, advantage_scope)
            self.pods_m, self.pods_rule, self.pods_scope = m, rule, advantage_scope
            self._pods_rewards: torch.Tensor | None = None
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kw)
            self._pods_generator = torch.Generator().manual_seed(args.seed + self.accelerator.process_index)  # rule 'random'

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            self._pods_rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # [all rows, F]
            return self._pods_rewards

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            return cut(self, out) if self.model.training else out  # evaluation: TRL's own batch

    return PodsGRPOTrainer


def cut(trainer, out: dict) -> dict:
    """The hook: this process's generation batch ``out`` (TRL's dict, B rows) cut to the kept rows, their advantages
    and TRL's token normaliser over them."""
    size = out["completion_ids"].shape[0]
    rewards = local_rewards(trainer._pods_rewards, trainer.reward_weights, trainer.accelerator.process_index, size)
    rows, adv = kept.keep(
        rewards,
        trainer.num_generations,
        trainer.pods_m,
        trainer.pods_rule,
        scope=trainer.pods_scope,
        scale=trainer.scale_rewards,
        group_advantages=out["advantages"].detach().cpu(),
        generator=trainer._pods_generator,
    )
    metrics = trainer._metrics["train"]
    metrics["pods/kept_reward"].append(rewards[rows].mean().item())
    metrics["pods/kept_reward_std"].append(rewards[rows].std().item() if rows.numel() > 1 else 0.0)
    out = kept.take(out, rows, size)
    out["advantages"] = adv.to(out["completion_ids"].device)
    mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
    out["num_items_in_batch"] = trainer.accelerator.gather(mask.sum()).sum()
    return out


def local_rewards(per_func: torch.Tensor, weights: torch.Tensor, process: int, size: int) -> torch.Tensor:
    """This process's rows of the rewards TRL computed (``per_func: [all rows, F]``, every process's), weighted and
    summed: ``[size]`` on the CPU. A completion no reward function scored is NaN (the rule refuses it)."""
    summed = (per_func * weights.to(per_func.device)).nansum(dim=1)
    summed[torch.isnan(per_func).all(dim=1)] = torch.nan
    return summed[process * size : (process + 1) * size].cpu()


def task_dataset(examples: Sequence) -> list[dict]:
    """pods examples (``pods.tasks``: ``.messages``, ``.gold``) as TRL's conversational rows: ``prompt`` and ``gold``
    (TRL passes ``gold`` to the reward function). ``datasets.Dataset.from_list`` takes the result."""
    return [{"prompt": list(ex.messages), "gold": ex.gold} for ex in examples]


def task_reward(recipe: str, grader: str, timeout_s: float | None = None) -> Callable[..., list[float]]:
    """A TRL reward function scoring completions with a pods recipe and grader (``pods.tasks.score_batch``; its
    ``timeout_s``: None scores in this process). Named ``pods_<recipe>`` in TRL's logs."""
    from pods.tasks import score_batch

    def reward(completions, gold, **_) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [s.reward for s in score_batch(texts, list(gold), recipe, grader, timeout_s=timeout_s)]

    reward.__name__ = f"pods_{recipe}"
    return reward
