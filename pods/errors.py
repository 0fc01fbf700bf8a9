"""The package's error for bad input: the ground floor, imported by every layer and importing nothing of pods."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value, file or command line: one line naming the key (``pods.train`` exits 2 with it)."""
