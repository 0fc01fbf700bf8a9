"""One-line messages for schema errors: the dotted key, what is wrong, the valid values or the closest valid key
(``Section.of`` and ``check`` raise them; the keys of a dotted path: ``pods.schema.closest_key``)."""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ValidationError

from pods.errors import ConfigError


def explain(e: ValidationError, model: type[BaseModel], where: str = "") -> str:
    """One line for a pydantic error: the dotted key, what is wrong, the valid values (or the closest key)."""
    errors = e.errors(include_url=False)
    err = next((x for x in errors if x["type"] != "missing"), errors[0])  # a wrong value says more than a missing key
    loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "lax-", "strict-"))]
    key = ".".join([where, *loc] if where else loc)
    got, kind = err.get("input"), err["type"]
    if kind == "value_error" and isinstance(err.get("ctx", {}).get("error"), ConfigError):
        return str(err["ctx"]["error"])  # a section's own rule: its message is already the one line
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    if kind == "extra_forbidden":
        owner = _model_at(model, loc[:-1])
        valid = list(owner.model_fields) if owner else []
        close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
        hint = f"did you mean '{'.'.join([*key.split('.')[:-1], close[0]])}'? " if close else ""
        return f"{key}: unknown key; {hint}valid keys here: {', '.join(valid)}{more}"
    if kind == "missing":
        return f"{key} is required{more}"
    if kind == "literal_error":
        return f"{key} must be one of {err['ctx']['expected']}, got {got!r}{more}"
    if kind in ("float_type", "float_parsing"):
        return f"{key} must be a number, got {got!r}{more}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{key} must be an integer, got {got!r}{more}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": "> {gt}", "greater_than_equal": ">= {ge}", "less_than": "< {lt}", "less_than_equal": "<= {le}"}[kind]
        bound = op.format(**{k: v if isinstance(v, int) else f"{v:g}" for k, v in err["ctx"].items()})  # 2147483647, not 2.14748e+09
        return f"{key} must be {bound}{' (or null)' if _optional(model, loc) else ''}, got {got!r}{more}"
    if kind in ("too_short", "too_long"):
        return f"{key} must have {_size(model, loc)} items, got {got!r}{more}"
    msg = err["msg"][0].lower() + err["msg"][1:]
    return f"{key}: {msg}, got {got!r}{more}"


def _size(model: type[BaseModel], loc: list[str]) -> str:
    owner = _model_at(model, loc[:-1])
    meta = {type(m).__name__: m for m in owner.model_fields[loc[-1]].metadata} if owner else {}
    lo, hi = getattr(meta.get("MinLen"), "min_length", None), getattr(meta.get("MaxLen"), "max_length", None)
    return str(lo) if lo == hi else f"{lo or 0}..{hi if hi is not None else 'any'}"


def _model_at(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    for part in path:
        field = model.model_fields.get(part)
        model = section_of(field.annotation) if field else None
        if model is None:
            return None
    return model


def section_of(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = section_of(arg)
        if found:
            return found
    return None


def _optional(model: type[BaseModel], loc: list[str]) -> bool:
    owner = _model_at(model, loc[:-1])
    field = owner.model_fields.get(loc[-1]) if owner and loc else None
    return bool(field) and type(None) in getattr(field.annotation, "__args__", ())
