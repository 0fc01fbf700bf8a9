"""The one way to compose ``conf/`` into a config: Hydra's compose API over the shipped tree, resolved to a plain
dict (``compose_plain``) or checked into the typed root (``compose``). Used by ``pods.train``'s preflight, the
memory report, the figures, the tests and the benchmarks. Composition problems raise ``ConfigError`` in one line.
"""

from __future__ import annotations

import difflib
import itertools
import re
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pods.config import validate
from pods.errors import ConfigError
from pods.schema import Root, check, register

CONF = Path(__file__).resolve().parent / "conf"  # shipped with the package; the repository's conf/ links here


def to_plain(cfg: DictConfig) -> dict:
    """Resolve every interpolation; a missing required value (???) raises here, naming the key."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


@contextmanager
def hydra_context(job_name: str = "pods"):
    """Hydra's compose API initialised on ``conf/`` (with the schema's nodes registered) for the ``with`` body."""
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=job_name):
        yield


def compose_job(overrides: list[str], config_name: str = "config") -> DictConfig:
    """One job's config with its ``hydra`` node, inside ``hydra_context``; ``ConfigError`` in one line."""
    from hydra import compose as hydra_compose
    from hydra.errors import MissingConfigException

    try:
        return hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    except MissingConfigException as e:
        raise ConfigError(_unknown_option(str(e))) from None
    except Exception as e:  # noqa: BLE001 - hydra's composition and override errors, omegaconf's type errors
        raise ConfigError(_composition(e)) from None


def job_dict(cfg: DictConfig) -> dict:
    """A composed job without its ``hydra`` node, resolved as in the run (``${hydra:...}`` included)."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)
    try:
        return to_plain(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
    except Exception as e:  # noqa: BLE001 - omegaconf's MissingMandatoryValue / InterpolationResolutionError
        raise ConfigError(_composition(e)) from None


def compose_plain(overrides: list[str] | None = None, config_name: str = "config", job_name: str = "pods") -> dict:
    """The resolved, unchecked plain dict of ``python -m pods.train <overrides>`` (what a test shrinks)."""
    with hydra_context(job_name):
        return job_dict(compose_job(list(overrides or []), config_name))


def compose(overrides: list[str] | None = None, rules: bool = True, job_name: str = "pods") -> Root:
    """The typed, checked config: the schema and (``rules``) the cross-field rules and the model's availability.
    ``rules=False`` is the schema alone (the memory report: a hub model need not be reachable here)."""
    plain = compose_plain(overrides, job_name=job_name)
    if not rules:
        return check(plain)
    return validate(plain)


def parse(overrides: list[str]) -> list:
    """Hydra's parsed overrides; ``ConfigError`` naming the one that does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for text in overrides:
        try:
            out.append(parser.parse_override(text))
        except Exception as e:  # noqa: BLE001 - hydra's OverrideParseException
            raise ConfigError(f"cannot parse the override '{text}': {first_line(e)}") from None
    return out


def expand(overrides: list[str]) -> list[list[str]]:
    """The jobs of a sweep as Hydra's basic sweeper makes them: the product of every key's values, one list of
    ``key=value`` per job; a key given twice keeps its first place and its last values."""
    final: dict[str, list[str]] = {}
    for text, o in zip(overrides, parse(overrides)):
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise ConfigError(f"{text}: only lists (a,b,c) and range() can be swept here")
        final[key] = (
            [f"{key}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [f"{key}={o.get_value_element_as_str()}"]
        )
    return [list(job) for job in itertools.product(*final.values())]


def first_line(e: Exception) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def _unknown_option(msg: str) -> str:
    """Hydra's "Could not find 'algorithm/nope'" (and its list of options) as one line."""
    m = re.search(r"Could not (?:find|load) '([^']+)'", msg)
    path = m.group(1) if m else ""
    group, _, name = path.rpartition("/")
    options = sorted(p.stem for p in (CONF / group).glob("*.yaml")) if group else []
    if not options:
        return first_line(Exception(msg))
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{group}: unknown option '{name}'; {hint}valid: {', '.join(options)}"


def _composition(e: Exception) -> str:
    """One line for an error Hydra or OmegaConf raised while composing; an unknown key names the closest one."""
    from pods.schema import closest_key

    msg = str(e)
    m = re.search(r"Could not override '([^']+)'", msg) or re.search(r"Key '([^']+)' is not in struct", msg)
    if m:
        key = m.group(1)
        full = re.search(r"full_key: (\S+)", msg)
        key = full.group(1) if full and "." not in key else key
        return closest_key(key)
    full = getattr(e, "full_key", None)
    text = first_line(e)
    return f"{full}: {text}" if full and not text.startswith(str(full)) else text
