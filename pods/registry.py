"""One generic name -> object registry, used for every pluggable kind (rules, engines, tasks, ...).

An entry is either an object or a lazy ``"module:attribute"`` string, imported on first ``get`` so
that heavy dependencies (vLLM, DeepSpeed) load only when a config names them.

What a plug-in needs from its caller (a pre-pass, its options, a gather over ranks) is declared in a spec: a
frozen dataclass of the registry's own spec type, given with the entry (``register(name, spec=...)``,
``register_lazy(name, target, spec=...)``) and read by ``spec(name)`` without importing a lazy entry; an entry
registered without one has the spec type's defaults.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any


class Registry:
    def __init__(self, kind: str, spec: type | None = None):
        """``kind``: what an entry is, for messages; ``spec``: the frozen dataclass its entries' specs are (None: no
        spec)."""
        if spec is not None and not (dataclasses.is_dataclass(spec) and spec.__dataclass_params__.frozen):
            raise TypeError(f"the spec type of {kind} must be a frozen dataclass, got {spec!r}")
        self.kind = kind
        self.spec_type = spec
        self._items: dict[str, Any] = {}
        self._specs: dict[str, Any] = {}

    def _add_spec(self, name: str, spec: Any) -> None:
        if spec is None:
            return
        if self.spec_type is None or type(spec) is not self.spec_type:
            want = self.spec_type.__name__ if self.spec_type is not None else "no spec"
            raise TypeError(f"{self.kind} '{name}': the spec must be a {want}, got {type(spec).__name__}")
        if self._specs.get(name, spec) != spec:
            raise ValueError(f"{self.kind} '{name}' is registered twice with different specs")
        self._specs[name] = spec

    def register(self, name: str, obj: Any = None, *, spec: Any = None) -> Callable:
        """Register ``obj`` under ``name`` with ``spec`` (an instance of the spec type; None: its defaults); without
        ``obj`` it returns a decorator."""

        def add(o: Any) -> Any:
            if name in self._items and self._items[name] is not o:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._add_spec(name, spec)
            self._items[name] = o
            return o

        return add if obj is None else add(obj)

    def register_lazy(self, name: str, target: str, *, spec: Any = None) -> None:
        """Register ``"package.module:attr"``, imported when first asked for; ``spec`` is known without importing it."""
        self._add_spec(name, spec)
        self._items[name] = target

    def get(self, name: str) -> Any:
        self._known(name)
        obj = self._items[name]
        if isinstance(obj, str):
            module, _, attr = obj.partition(":")
            obj = getattr(importlib.import_module(module), attr)
            self._items[name] = obj
        return obj

    def spec(self, name: str) -> Any:
        """The spec registered with ``name``, else the spec type's defaults (nothing is imported)."""
        self._known(name)
        if self.spec_type is None:
            raise TypeError(f"{self.kind} entries carry no spec")
        return self._specs[name] if name in self._specs else self.spec_type()

    def _known(self, name: str) -> None:
        if name not in self._items:
            raise ValueError(self.unknown(name))

    def names(self) -> list[str]:
        return sorted(self._items)

    def unknown(self, name: object) -> str:
        """The one message for a name not registered here, with the valid ones (``get`` raises it; config checks prefix it
        with the key)."""
        return f"unknown {self.kind} '{name}'; valid: {', '.join(self.names())}"

    def __contains__(self, name: object) -> bool:
        return name in self._items
