"""Benchmark evaluation: metrics over repeated samples (avg@k, pass@k, maj@k), benchmark and suite configs
(``conf/benchmark/``, ``conf/suite/``), and ``pods-eval`` (``python -m pods.eval``), which evaluates a model, a hub id
or a run directory on a suite and writes ``eval/<suite>/``."""
