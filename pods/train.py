"""Command line: ``python -m pods.train [experiment=NAME] [overrides]`` (Hydra; ``-m`` for sweeps).

Before Hydra starts a run (and makes its directory), ``preflight`` composes every run the command asks for (a
sweep: each combination) with Hydra's compose API and checks it: the schema (``pods.schema``), the cross-field
rules (``pods.config``) and, for a run on this machine, the machine (``pods.preflight``). A bad input exits with
code 2 and one line naming the key. The run itself gets the validated plain dict in ``pods.loop.train``.
"""

from __future__ import annotations

import difflib
import itertools
import re
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from pods.config import ConfigError
from pods.schema import register

register()  # the schema's defaults as the config nodes conf/ builds on (`_schema`, `<group>/_<shape>`)

CONF = Path(__file__).resolve().parent / "conf"  # shipped with the package; the repository's conf/ links here
MAX_CHECKED_JOBS = 512  # a larger sweep is checked job by job as it runs


def to_plain(cfg: DictConfig) -> dict:
    """Resolve every interpolation; a missing required value (???) raises here, naming the key."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def fail(e: Exception) -> None:
    print(f"pods: config error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)


def check(cfg: dict, machine: bool = True) -> dict:
    """Schema, cross-field rules and (``machine``) this machine's devices, files and hub access; the completed config."""
    from pods.config import validate
    from pods.preflight import check_environment

    cfg = validate(cfg)  # the schema, then the cross-field rules
    if machine:
        check_environment(cfg)
    return cfg


def preflight(argv: list[str]) -> None:
    """Compose and check every job of the command line; ``ConfigError`` on the first bad one. Only flags Hydra
    runs jobs with are understood (``-m``); with any other flag (``--cfg``, ``--help``, ...) Hydra decides alone."""
    from hydra import compose, initialize_config_dir

    multirun = any(a in ("-m", "--multirun") for a in argv)
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return
    overrides = [a for a in argv if a not in ("-m", "--multirun")]
    sweeps = [o for o, parsed in zip(overrides, _parse(overrides)) if parsed.is_sweep_override()]
    if sweeps and not multirun:
        raise ConfigError(f"{sweeps[0]}: several values need a sweep: add -m (--multirun)")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="train"):
        if not multirun:
            check(_job_dict(_compose(compose, overrides)))
            return
        first = _compose(compose, [o for o in overrides if o not in sweeps])
        params = [f"{k}={v}" for k, v in (OmegaConf.select(first, "hydra.sweeper.params") or {}).items()]
        for job in expand(params + overrides)[:MAX_CHECKED_JOBS]:
            check(_job_dict(_compose(compose, job)), machine=False)  # a sweep may run elsewhere (SLURM): each job checks its machine


def _parse(overrides: list[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for text in overrides:
        try:
            out.append(parser.parse_override(text))
        except Exception as e:  # noqa: BLE001 - hydra's OverrideParseException
            raise ConfigError(f"cannot parse the override '{text}': {_first_line(e)}") from None
    return out


def expand(overrides: list[str]) -> list[list[str]]:
    """The jobs of a sweep as Hydra's basic sweeper makes them: the product of every key's values, one list of
    ``key=value`` per job; a key given twice keeps its first place and its last values."""
    final: dict[str, list[str]] = {}
    for text, o in zip(overrides, _parse(overrides)):
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise ConfigError(f"{text}: only lists (a,b,c) and range() can be swept here")
        final[key] = (
            [f"{key}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [f"{key}={o.get_value_element_as_str()}"]
        )
    return [list(job) for job in itertools.product(*final.values())]


def _compose(compose, overrides: list[str]) -> DictConfig:
    from hydra.errors import MissingConfigException

    try:
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except MissingConfigException as e:
        raise ConfigError(_unknown_option(str(e), overrides)) from None
    except Exception as e:  # noqa: BLE001 - hydra's composition and override errors, omegaconf's type errors
        raise ConfigError(_composition(e)) from None


def _job_dict(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)  # ${hydra:...} interpolations resolve as in the run
    try:
        return to_plain(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
    except Exception as e:  # noqa: BLE001 - omegaconf's MissingMandatoryValue / InterpolationResolutionError
        raise ConfigError(_composition(e)) from None


def _first_line(e: Exception) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def _unknown_option(msg: str, overrides: list[str]) -> str:
    """Hydra's "Could not find 'algorithm/nope'" (and its list of options) as one line."""
    m = re.search(r"Could not (?:find|load) '([^']+)'", msg)
    path = m.group(1) if m else ""
    group, _, name = path.rpartition("/")
    options = sorted(p.stem for p in (CONF / group).glob("*.yaml")) if group else []
    if not options:
        return _first_line(Exception(msg))
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{group}: unknown option '{name}'; {hint}valid: {', '.join(options)}"


def _composition(e: Exception) -> str:
    """One line for an error Hydra or OmegaConf raised while composing; an unknown key names the closest one."""
    from pods.schema_errors import closest_key

    msg = str(e)
    m = re.search(r"Could not override '([^']+)'", msg) or re.search(r"Key '([^']+)' is not in struct", msg)
    if m:
        key = m.group(1)
        full = re.search(r"full_key: (\S+)", msg)
        key = full.group(1) if full and "." not in key else key
        return closest_key(key)
    full = getattr(e, "full_key", None)
    text = _first_line(e)
    return f"{full}: {text}" if full and not text.startswith(str(full)) else text


@hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from pods.log import setup
    from pods.loop import train

    log = setup()
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        plain = check(to_plain(cfg))
        last = train(plain, run_dir)
    except (ConfigError, FileNotFoundError) as e:
        fail(e)
    log.info(f"run directory: {run_dir}  final eval accuracy: {last.get('accuracy', float('nan')):.3f}")
    return last.get("accuracy")


def main() -> float | None:
    """``pods-train``: check the command line's runs, then let Hydra run them."""
    try:
        preflight(sys.argv[1:])
    except ConfigError as e:
        fail(e)
    return run()


if __name__ == "__main__":
    main()
