"""Tasks: datasets (prompts + gold answers), graders and reward recipes, each chosen by name.

Registering a new dataset/grader/recipe = one decorated function in a module listed in ``_MODULES``.
"""

from pods.tasks.base import DATASETS, GRADERS, RECIPES, Example, Score, TaskData, encode_prompts, score_batch

_MODULES = [
    "pods.tasks.toy",
    "pods.tasks.toy_long",
    "pods.tasks.toy_sum",
    "pods.tasks.graders",
    "pods.tasks.recipes",
    "pods.tasks.gsm8k",
    "pods.tasks.mathds",
    "pods.tasks.simplerl",
]


def load_builtin() -> None:
    """Import the modules that register the built-in tasks (cheap; no data is read)."""
    import importlib

    for module in _MODULES:
        importlib.import_module(module)


load_builtin()

__all__ = ["DATASETS", "GRADERS", "RECIPES", "Example", "Score", "TaskData", "encode_prompts", "score_batch"]
