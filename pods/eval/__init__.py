"""Evaluation, one package: the training loop's test accuracy (``accuracy``), and benchmark suites (``benchmarks``:
``conf/benchmark/``, ``conf/suite/``; ``metrics``: avg@n, pass@k, maj@k) evaluated by ONE typed function,
``run.evaluate_suite(suite, target, options, out)``, which ``pods-eval`` (``cli``, ``python -m pods.eval``) and a
training run's ``eval.suite`` both call; it writes ``eval/<suite>/``."""
