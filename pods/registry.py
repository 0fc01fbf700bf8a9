"""One generic name -> object registry, used for every pluggable kind (rules, engines, tasks, ...).

An entry is either an object or a lazy ``"module:attribute"`` string, imported on first ``get`` so
that heavy dependencies (vLLM, DeepSpeed) load only when a config names them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None) -> Callable:
        """Register ``obj`` under ``name``; without ``obj`` it returns a decorator."""

        def add(o: Any) -> Any:
            if name in self._items and self._items[name] is not o:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._items[name] = o
            return o

        return add if obj is None else add(obj)

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``"package.module:attr"``, imported when first asked for."""
        self._items[name] = target

    def get(self, name: str) -> Any:
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} '{name}'; valid: {', '.join(self.names())}")
        obj = self._items[name]
        if isinstance(obj, str):
            module, _, attr = obj.partition(":")
            obj = getattr(importlib.import_module(module), attr)
            self._items[name] = obj
        return obj

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
