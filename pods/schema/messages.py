"""One-line messages for schema errors: the dotted key, what is wrong, the valid values or the closest valid key."""

from __future__ import annotations

import difflib

from pydantic import ValidationError

from pods.errors import ConfigError
from pods.schema.sections import SHAPES, Root, Section


def explain(e: ValidationError, model: type[Section], where: str = "") -> str:
    """One line for a pydantic error: the dotted key, what is wrong, the valid values (or the closest key)."""
    err = e.errors(include_url=False)[0]
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
        bound = op.format(**{k: f"{v:g}" for k, v in err["ctx"].items()})
        return f"{key} must be {bound}{' (or null)' if _optional(model, loc) else ''}, got {got!r}{more}"
    if kind in ("too_short", "too_long"):
        return f"{key} must have {_size(model, loc)} items, got {got!r}{more}"
    msg = err["msg"][0].lower() + err["msg"][1:]
    return f"{key}: {msg}, got {got!r}{more}"


def _size(model: type[Section], loc: list[str]) -> str:
    owner = _model_at(model, loc[:-1])
    meta = {type(m).__name__: m for m in owner.model_fields[loc[-1]].metadata} if owner else {}
    lo, hi = getattr(meta.get("MinLen"), "min_length", None), getattr(meta.get("MaxLen"), "max_length", None)
    return str(lo) if lo == hi else f"{lo or 0}..{hi if hi is not None else 'any'}"


def _model_at(model: type[Section], path: list[str]) -> type[Section] | None:
    for part in path:
        field = model.model_fields.get(part)
        model = _section_of(field.annotation) if field else None
        if model is None:
            return None
    return model


def _section_of(annotation) -> type[Section] | None:
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _section_of(arg)
        if found:
            return found
    return None


def _optional(model: type[Section], loc: list[str]) -> bool:
    owner = _model_at(model, loc[:-1])
    field = owner.model_fields.get(loc[-1]) if owner and loc else None
    return bool(field) and type(None) in getattr(field.annotation, "__args__", ())


def keys_at(path: list[str]) -> list[str] | None:
    """The valid keys under a dotted path (a group: the union over its shapes), or None if the path is not a section."""
    models: list[type[Section]] = [Root]
    for part in path:
        nxt: list[type[Section]] = []
        for model in models:
            field = model.model_fields.get(part)
            if field is None:
                continue
            shapes = SHAPES.get(part) if model is Root else None
            if shapes:
                nxt += [m for v in shapes.values() for m in (v if isinstance(v, tuple) else (v,))]
            elif (sub := _section_of(field.annotation)) is not None:
                nxt.append(sub)
        if not nxt:
            return None
        models = list(dict.fromkeys(nxt))
    return list(dict.fromkeys(k for m in models for k in m.model_fields))


def closest_key(key: str) -> str:
    """The one-line message for a key the composed config does not have: unknown, or valid but not set here."""
    *parent, leaf = key.split(".")
    valid = keys_at(parent)
    if valid is None:
        return f"{key}: unknown key ('{'.'.join(parent)}' is not a section)"
    if leaf in valid:
        return f"{key} is not set by the chosen group option: add it with +{key}=VALUE"
    close = difflib.get_close_matches(leaf, valid, n=1, cutoff=0.5)
    hint = f"did you mean '{'.'.join([*parent, close[0]])}'? " if close else ""
    return f"{key}: unknown key; {hint}valid keys here: {', '.join(valid)}"
