"""Peak GPU memory of a run, estimated from the resolved config and the model's config.json alone (no weights).

``pods.memory.estimator``: ``estimate(cfg)`` -> ``Estimate`` and ``check_fits(cfg)`` (the refusal ``pods.preflight``
runs before any model loads); ``pods.memory.update``: the policy update's lines; each rollout engine brings its own
(``Engine.memory``, ``pods.engines.memory``, which also holds the vocabulary: ``Line``, ``EngineMemory``, ``GB``).
``python -m pods.memory <overrides>`` (``make memory ARGS=...``) prints the table; ``--all`` writes one row per GPU
experiment (``pods.memory.report``). This ``__init__`` defines nothing and imports nothing: importing
``pods.memory`` runs no estimate and loads neither torch nor the engines. docs/memory.md describes the model.
"""
