"""``make tiny-model``: rebuild every tiny model the committed configs use and say how far each rebuild is from the
weights shipped in pods/assets/ (max |difference| per tensor, weight hash equal or not).

    python scripts/tiny_model.py [--out DIR] [--ship]

The build runs with the pinned CPU numerics (``pods.numerics``) and one torch thread, as the shipped weights were
built, so on an x86-64 CPU with AVX2 a rebuild should give the same bits. ``--ship`` (maintainers, after a change to
the build or to a committed spec) writes the builds into pods/assets/. Exit 1 when a rebuild differs or a committed
spec is not shipped.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing pods

from pods.numerics import pin, summary_line  # noqa: E402

pin()  # before torch loads (pods.tiny imports it)

from pods.tiny import (  # noqa: E402
    ASSETS,
    SHIPPED_FILES,
    asset_name,
    build_tiny,
    full_spec,
    shipped,
    weights_gap,
    weights_hash,
    with_template_kwargs,
)


def committed_specs() -> dict[str, dict]:
    """Asset name -> full spec of every tiny model a committed config uses (the default config, each experiment and
    each model config, its chat template's arguments folded in as the builder does)."""
    from pods.compose import CONF, compose_plain

    found = {}
    runs = [[f"experiment={p.stem}"] for p in sorted((CONF / "experiment").glob("*.yaml"))]
    models = [[f"model={p.stem}"] for p in sorted((CONF / "model").glob("*.yaml")) if not p.stem.startswith("_")]
    for overrides in [[]] + runs + models:
        model = compose_plain(overrides)["model"]
        if model.get("builder") == "tiny":  # a filter (which configs use pods.tiny), not a dispatch
            spec = with_template_kwargs(model.get("spec"), model.get("chat_template_kwargs"))
            found[asset_name(spec)] = full_spec(spec)
    return found


def ship(build: Path, name: str) -> str:
    shutil.rmtree(ASSETS / name, ignore_errors=True)
    (ASSETS / name).mkdir(parents=True)
    for f in SHIPPED_FILES:
        shutil.copyfile(build / f, ASSETS / name / f)
    return f"{name}: shipped {weights_hash(build)} ({ASSETS / name})"


def compare(build: Path, name: str, spec: dict) -> list[str]:
    have = shipped(spec)
    if have is None:
        return [f"{name}: NOT SHIPPED (rebuilt into {build}, weights {weights_hash(build)})"]
    gap = weights_gap(have, build)
    worst = max(gap, key=gap.get)
    same = "EQUAL" if weights_hash(have) == weights_hash(build) else "DIFFERENT"
    head = f"{name}: rebuild {weights_hash(build)} vs shipped {weights_hash(have)}: {same}; max |diff| {gap[worst]:.3g} ({worst})"
    return [head] + [f"    {k}: {v:.3g}" for k, v in gap.items() if v > 0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="build directory (default: a temporary one)")
    p.add_argument("--ship", action="store_true", help="write the builds into pods/assets/ (replacing what is there)")
    args = p.parse_args(argv)
    lines = []
    with tempfile.TemporaryDirectory(prefix="pods-tiny-") as tmp:
        for name, spec in committed_specs().items():
            build = Path(args.out or tmp) / name
            if not (build / "pods_tiny.json").exists():
                build_tiny(spec, build)
            lines += [ship(build, name)] if args.ship else compare(build, name, spec)
    print(summary_line())
    print("\n".join(lines))
    return 0 if args.ship or all("EQUAL" in x for x in lines if not x.startswith(" ")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
