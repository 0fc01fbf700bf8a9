"""The package's error for bad input: the ground floor, imported by every layer and importing nothing of pods."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value, file or command line: one line naming the key (``pods.train`` exits 2 with it)."""


class ServerError(RuntimeError):
    """A vLLM server that died, hung past its timeout or refused a call, mid-run: one line naming the server, the call
    and its log (``pods.train`` exits 1 with it and says where the run resumes from)."""


def need(cond: object, msg: str) -> None:
    """``ConfigError(msg)`` unless ``cond``: the one form of a rule's check (the schema's, the registries', the engines')."""
    if not cond:
        raise ConfigError(msg)
