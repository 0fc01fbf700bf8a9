"""The typed schema of the configuration (the sections: ``pods.schema.sections``).

``check(cfg)`` validates a composed config (a plain dict) right after Hydra composes it and returns the typed
``Root``: every key present and typed, defaults filled in from the sections, the rules within a section checked, so
the code reads ``cfg.train.keep_checkpoints`` and never carries a default of its own. Any problem raises
``ConfigError`` with ONE line that names the key and the valid values; an unknown key names the closest valid one.
Rules that read the registries (names of rules, engines, graders...) are ``pods.config.validate``'s.

A group whose options differ in shape picks its model by ``name`` (``SHAPES``): ``rollout=hf`` has no vLLM keys.
"""

from __future__ import annotations

import copy
import difflib

from pydantic import BaseModel, ValidationError

from pods.errors import ConfigError
from pods.schema.base import Frac, Pos  # noqa: F401 - the shared field types (a share in (0, 1], a positive count), for sections outside this package
from pods.schema.messages import explain, section_of
from pods.schema.rollouts import ROLLOUTS
from pods.schema.sections import (  # noqa: F401 - the sections are this package's public names
    SHAPES,
    Algorithm,
    DeepSpeed,
    Eval,
    Hardware,
    HfRollout,
    Hub,
    HubDataset,
    Lora,
    Model,
    NoLogger,
    Optim,
    Root,
    Sampling,
    Section,
    Slurm,
    SparseHfRollout,
    SparseRl,
    ToyDataset,
    ToyLongDataset,
    Train,
    VllmRollout,
    VllmServerRollout,
    Wandb,
)


def check(cfg: dict | Root) -> Root:
    """``cfg`` validated and completed as the typed ``Root``, or ``ConfigError`` in one line naming the key."""
    if isinstance(cfg, Root):
        return cfg
    if not isinstance(cfg, dict):
        raise ConfigError(f"the config must be a mapping, got {type(cfg).__name__}")
    node = dict(cfg)
    for group, shapes in SHAPES.items():
        if group not in node:
            continue  # Root names the missing required group
        sub = node[group]
        name = sub.get("name") if isinstance(sub, dict) else None
        if not isinstance(name, str):
            raise ConfigError(f"{group}.name is required (a string), got {name!r}")
        models = shapes.get(name, shapes["*"])
        node[group] = _first_fit(models if isinstance(models, tuple) else (models,), sub, group)
    return validated(Root, node, "")


def _first_fit(models: tuple[type[Section], ...], node: dict, where: str) -> Section:
    error = None
    for model in models:
        try:
            return validated(model, node, where)
        except ConfigError as e:
            error = error or e
    raise error


def validated(model: type[Section], node: dict, where: str) -> Section:
    """``node`` validated strictly as ``model`` (no defaults merged in but the model's own), or ``ConfigError`` in one
    line naming the key under ``where`` (a section's dotted key, '' for a config of its own: a suite, eval options)."""
    try:
        return model.model_validate(node)
    except ValidationError as e:
        raise ConfigError(explain(e, model, where)) from None


def defaults(model: type[Section]) -> dict:
    """The schema's default of every key of ``model`` that has one (required keys are left out)."""
    out = {k: f.get_default(call_default_factory=True) for k, f in model.model_fields.items() if not f.is_required()}
    return {k: v.model_dump() if isinstance(v, BaseModel) else copy.deepcopy(v) for k, v in out.items()}


def complete(model: type[Section], node: dict | None = None, **values) -> Section:
    """One section for a caller that builds its own (a test, a script): the schema's defaults, then ``node``, then
    ``values``, validated as ``model.of`` validates (``ConfigError`` in one line naming the key)."""
    return model.of({**dict(node or {}), **values})  # a mapping or a section (its fields)


def nodes() -> dict[str, dict]:
    """The schema's defaults as Hydra config nodes: ``_schema`` (the top-level sections) and one ``<group>/_<shape>``
    per shape of a group, which the group's YAML files name first in their ``defaults`` list."""
    out = {
        "_schema": {"seed": 0, **{k: defaults(m) for k, m in (("sampling", Sampling), ("train", Train), ("optim", Optim), ("eval", Eval))}}
    }
    shapes = {
        "model": Model,
        "dataset/_hub": HubDataset,
        "dataset/_toy": ToyDataset,
        "dataset/_toy_long": ToyLongDataset,
        **{f"rollout/_{name}": section for name, section in ROLLOUTS.items()},
        "hardware": Hardware,
        "algorithm": Algorithm,
        "logger/_none": NoLogger,
        "logger/_wandb": Wandb,
    }
    for where, model in shapes.items():
        out[where if "/" in where else f"{where}/_base"] = defaults(model)
    return out


def register(more: dict[str, dict] | None = None) -> None:
    """Put ``nodes()`` and ``more`` (other ``group/name`` nodes: the suites', ``pods.eval.benchmarks.nodes``) into
    Hydra's ConfigStore (idempotent), the one place that registers config nodes; call before composing ``conf/``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for where, node in {**nodes(), **(more or {})}.items():
        group, _, name = where.rpartition("/")
        cs.store(group=group or None, name=name, node=node)


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
            elif (sub := section_of(field.annotation)) is not None:
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
