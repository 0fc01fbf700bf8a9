"""The base of every configuration section: ``Section`` (read by attribute, ``Section.of`` validating a mapping), the
shared field types, and ``where`` (a section's dotted key in the config).

A section is read by attribute only: ``sec["key"]`` and ``sec["key"] = value`` raise ``TypeError`` (pydantic's
``BaseModel`` has no item access), so no value reaches a section without its validation (``Section.of``, ``complete``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pods.errors import ConfigError
from pods.schema.messages import explain

Pos = Annotated[int, Field(ge=1)]
PosF = Annotated[float, Field(gt=0)]
NonNegF = Annotated[float, Field(ge=0)]
Frac = Annotated[float, Field(gt=0, le=1)]  # (0, 1]
Files = str | list[str] | None


_ROOT: list[type[Section]] = []  # the root section, registered when its class is built (it imports every other)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    is_root: ClassVar[bool] = False  # True on the config's root (pods.schema.sections.Root): ``where`` walks from it

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.__dict__.get("is_root"):
            _ROOT[:] = [cls]

    @classmethod
    def of(cls, node: Any) -> Section:
        """``node`` as this section: an instance as it is; a mapping validated over the defaults (the door for callers
        that pass plain dicts), or ``ConfigError`` in one line naming the key. Never an unvalidated section."""
        if isinstance(node, cls):
            return node
        if not isinstance(node, Mapping | None):
            raise ConfigError(f"{where(cls) or cls.__name__} must be a mapping, got {type(node).__name__}")
        try:
            return cls.model_validate(dict(node or {}), strict=False)
        except ValidationError as e:
            raise ConfigError(explain(e, cls, where(cls))) from None


def where(model: type[Section]) -> str:
    """The dotted key of ``model``'s section in the config (``algorithm.sparse_rl``), '' for the root or a section
    outside it (a suite's)."""
    todo: list[tuple[type[Section], str]] = [(root, "") for root in _ROOT]
    while todo:
        owner, at = todo.pop(0)
        for key, field in owner.model_fields.items():
            for sub in _sections(field.annotation):
                path = f"{at}.{key}" if at else key
                if sub is model:
                    return path
                todo.append((sub, path))
    return ""


def _sections(annotation) -> list[type[Section]]:
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return [annotation]
    return [s for a in getattr(annotation, "__args__", ()) for s in _sections(a)]
