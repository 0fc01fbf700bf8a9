"""Prefetch every hub model and dataset the named experiments, figures and evaluation suites use into one directory,
for clusters whose compute nodes have no internet; and the Hydra overrides that point runs at those copies.

    python scripts/prefetch.py --dir /shared/pods-hub                          # everything (every model config too)
    python scripts/prefetch.py --dir DIR --figures 3-gsm8k-qwen3b-l40s 4-n      # what these figures' runs need
    python scripts/prefetch.py --dir DIR --experiments gsm8k_qwen3b_pods_64_16_l40s --suites pods
    python scripts/prefetch.py --dir DIR --check                               # download nothing: report what is missing
    python -m pods.train experiment=X $(python scripts/prefetch.py --dir DIR --args X)   # a run on the copies
    pods-eval MODEL --suite pods $(python scripts/prefetch.py --dir DIR --args suite/pods)

Layout under DIR: ``models/<org>--<name>/`` (config, tokenizer and safetensors weights: what ``from_pretrained`` and
vLLM read) and ``datasets/<org>--<name>/<config | default>/<split>.jsonl`` (the hub split's rows, columns as on the
hub: what ``dataset.train_files`` / ``dataset.test_files`` and a benchmark's ``files`` take). ``DIR/overrides.yaml``
holds, per experiment and per suite, the Hydra overrides that point it at these copies (also printed). With
``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` set, or ``--check``, nothing is downloaded: the report lists what is
missing and the exit code is 1. Gated models (Llama) need ``HF_TOKEN``. Nothing is deleted; reruns resume.
An unknown experiment, figure or suite, or a ``--dir`` that cannot be written (with ``--args``: a file), is refused
in one line (exit 2) before anything is downloaded.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pods.errors import ConfigError  # noqa: E402
from pods.files import atomic, writable  # noqa: E402

MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]  # config, tokenizer, weights; no .bin/.pth copies
_PLAIN = re.compile(r"^[\w/.\-]+$")  # Hydra takes these unquoted


@dataclass(frozen=True)
class Model:
    id: str

    def path(self, root: Path) -> Path:
        return root / "models" / self.id.replace("/", "--")

    def present(self, root: Path) -> bool:
        """config.json and every weight shard the index names (or, without an index, some safetensors)."""
        d = self.path(root)
        if not (d / "config.json").is_file():
            return False
        index = d / "model.safetensors.index.json"
        if index.is_file():
            import json

            return all((d / f).is_file() for f in set(json.loads(index.read_text())["weight_map"].values()))
        return any(d.glob("*.safetensors"))

    def __str__(self) -> str:
        return f"model {self.id}"


@dataclass(frozen=True)
class Split:
    id: str
    config: str | None
    split: str

    def path(self, root: Path) -> Path:
        return root / "datasets" / self.id.replace("/", "--") / (self.config or "default") / f"{self.split}.jsonl"

    def present(self, root: Path) -> bool:
        return self.path(root).is_file()

    def __str__(self) -> str:
        return f"dataset {self.id}" + (f" [{self.config}]" if self.config else "") + f" {self.split}"


@dataclass
class Needs:
    """What one experiment or suite reads from the hub: per override key, the items whose copies it takes."""

    name: str
    keys: dict[str, list] = field(default_factory=dict)  # "model.path" -> [Model], "dataset.train_files" -> [Split, ...]

    def items(self) -> list:
        return [item for items in self.keys.values() for item in items]

    def overrides(self, root: Path) -> list[str]:
        return [f"{key}={hydra_value([str(i.path(root)) for i in items])}" for key, items in self.keys.items()]


def hydra_value(values: list[str]) -> str:
    """One value as is, several as a Hydra list; quoted where Hydra's grammar needs it."""
    quoted = [v if _PLAIN.match(v) else "'" + v.replace("'", "\\'") + "'" for v in values]
    return quoted[0] if len(quoted) == 1 else "[" + ",".join(quoted) + "]"


def hub_splits(hub: dict | None) -> list[Split]:
    """The splits a ``{id, configs, split}`` hub entry loads (one per config)."""
    if not hub:
        return []
    return [Split(hub["id"], config, hub["split"]) for config in hub["configs"] or [None]]


def is_hub_id(path: str | None) -> bool:
    return bool(path) and not (Path(path).is_absolute() or path.startswith(".") or Path(path).exists())


def plan_model(name: str) -> Needs:
    """The hub model of ``model=name`` (a model config no experiment uses: ``model/NAME``), unless built in code."""
    from pods.compose import compose_plain

    needs, model = Needs(f"model/{name}"), compose_plain([f"model={name}"])["model"]
    if not model.get("builder") and is_hub_id(model.get("path")):
        needs.keys["model.path"] = [Model(model["path"])]
    return needs


def plan_experiment(name: str) -> Needs:
    """The hub model (``model.path``, unless built in code or local) and hub datasets of ``experiment=name``
    (``model/NAME``: a model config alone, ``plan_model``)."""
    from pods.compose import compose_plain

    if name.startswith("model/"):
        return plan_model(name.removeprefix("model/"))
    cfg = compose_plain([f"experiment={name}"])
    needs, model, ds = Needs(name), cfg["model"], cfg["dataset"]
    if not model.get("builder") and is_hub_id(model.get("path")):
        needs.keys["model.path"] = [Model(model["path"])]
    for split in ("train", "test"):
        splits = [] if ds.get(f"{split}_files") else hub_splits(ds.get(f"{split}_hub"))
        if splits:
            needs.keys[f"dataset.{split}_files"] = splits
    return needs


def plan_suite(name: str) -> Needs:
    """The hub datasets of evaluation suite ``name`` (``pods-eval --suite name``): ``suite.benchmarks.<key>.files``."""
    from pods.eval.benchmarks import compose_suite

    needs = Needs(f"suite/{name}")
    for key, bench in compose_suite(name).benchmarks.items():
        splits = [] if bench.files else hub_splits(bench.hub.model_dump() if bench.hub else None)
        if splits:
            needs.keys[f"suite.benchmarks.{key}.files"] = splits
    return needs


def names(group: str) -> list[str]:
    from pods.compose import CONF

    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))


def selection(a) -> tuple[list[str], list[str]]:
    """(experiments, suites) asked for; nothing asked = every experiment and suite, and every model config as
    ``model/NAME`` (Qwen3's, which no experiment names)."""
    experiments, suites = list(a.experiments or []), list(a.suites or [])
    if a.figures:
        from pods.figures import FIGURES

        experiments += [e for f in a.figures for e in FIGURES[f].experiments]
    if not (a.experiments or a.suites or a.figures):
        experiments, suites = names("experiment") + [f"model/{m}" for m in names("model")], names("suite")
    return list(dict.fromkeys(experiments)), list(dict.fromkeys(suites))


def plan(experiments: list[str], suites: list[str]) -> list[Needs]:
    """Each experiment and suite that needs something from the hub (toy and tiny-model ones need nothing)."""
    every = [plan_experiment(e) for e in experiments] + [plan_suite(s) for s in suites]
    return [n for n in every if n.keys]


def fetch_model(model: Model, root: Path) -> None:
    """Into ``models/<org>--<name>``: resumable (huggingface_hub keeps its own bookkeeping inside the directory)."""
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id=model.id, local_dir=model.path(root), allow_patterns=MODEL_FILES)


def export_split(ds, path: Path) -> None:
    """A ``datasets.Dataset`` as JSON lines at ``path``, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    ds.to_json(str(part), lines=True, force_ascii=False)
    part.replace(path)


def fetch_split(split: Split, root: Path) -> None:
    import datasets

    export_split(datasets.load_dataset(split.id, split.config, split=split.split), split.path(root))


FETCH = {Model: fetch_model, Split: fetch_split}


def offline() -> bool:
    return any(os.environ.get(v, "").lower() in {"1", "true", "yes", "on"} for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def report(needs: list[Needs], root: Path) -> list[str]:
    """One line per distinct item: present or missing, where, and who needs it."""
    users: dict = {}
    for n in needs:
        for item in n.items():
            users.setdefault(item, []).append(n.name)
    return [
        f"{'present' if item.present(root) else 'MISSING'}  {item}  ->  {item.path(root)}  ({', '.join(dict.fromkeys(who))})"
        for item, who in users.items()
    ]


def download(needs: list[Needs], root: Path) -> list[str]:
    """Fetch every missing item; returns one line per failure (the rest go on)."""
    todo = list(dict.fromkeys(i for n in needs for i in n.items() if not i.present(root)))
    failures = []
    for k, item in enumerate(todo, 1):
        print(f"[prefetch] ({k}/{len(todo)}) {item} -> {item.path(root)}", flush=True)
        try:
            FETCH[type(item)](item, root)
        except Exception as e:  # noqa: BLE001 - network, gated repos, unknown ids: say which and go on
            failures.append(f"{item}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return failures


def write_overrides(needs: list[Needs], root: Path) -> Path:
    import yaml

    path = root / "overrides.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {n.name: n.overrides(root) for n in needs}
    head = f"# Hydra overrides pointing runs at the copies in {root} (scripts/prefetch.py).\n"
    head += f"# python -m pods.train experiment=NAME $(python scripts/prefetch.py --dir {root} --args NAME)\n"
    with atomic(path) as f:
        f.write(head + yaml.safe_dump(body, sort_keys=True, width=1000))
    return path


def args_of(name: str, root: Path) -> str:
    """The overrides of one experiment (``NAME``) or suite (``suite/NAME``), shell-quoted on one line."""
    needs = plan_suite(name.removeprefix("suite/")) if name.startswith("suite/") else plan_experiment(name)
    return " ".join(shlex.quote(o) for o in needs.overrides(root))


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    root = Path(a.dir).resolve()
    try:
        if a.args:  # prints paths only: DIR may be a read-only copy on a compute node, but not a file
            if root.is_file():
                raise ConfigError(f"--dir: {a.dir} is a file, not a directory")
            print(args_of(a.args, root))
            return 0
        writable(root, "--dir", directory=True)
        needs = plan(*selection(a))
    except ConfigError as e:
        print(f"prefetch.py: error: {e}", file=sys.stderr)
        return 2
    failures = [] if a.check or offline() else download(needs, root)
    lines = report(needs, root)
    path = write_overrides(needs, root)
    print("\n".join(lines))
    for n in needs:
        print(f"[prefetch] {n.name}: {' '.join(n.overrides(root))}")
    print(f"[prefetch] overrides written to {path}")
    missing = sum(line.startswith("MISSING") for line in lines)
    if missing:
        why = "--check" if a.check else "offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE)" if offline() else "downloads failed"
        print(f"[prefetch] {missing} of {len(lines)} missing ({why})" + "".join(f"\n  {f}" for f in failures), file=sys.stderr)
    return 1 if missing else 0


def parse(argv: list[str] | None):
    from pods.figures import FIGURES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True, help="where the copies go (a file system the compute nodes see)")
    p.add_argument("--experiments", nargs="+", metavar="NAME", help="experiment files (conf/experiment/NAME.yaml)")
    p.add_argument("--figures", nargs="+", choices=sorted(FIGURES), help="the experiments of these figures (pods.figures)")
    p.add_argument("--suites", nargs="+", metavar="NAME", help="evaluation suites (conf/suite/NAME.yaml, pods-eval --suite)")
    p.add_argument("--check", action="store_true", help="download nothing; report what is present and missing")
    p.add_argument("--args", metavar="NAME", help="print the overrides of experiment NAME (or suite/NAME, model/NAME) and exit")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
