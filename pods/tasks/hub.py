"""Loading dataset records: local json/jsonl/parquet/csv files, or a Hugging Face hub id.

``load_split(ds, "train")`` reads ``ds.train_files`` when set, else ``ds.train_hub``
(``{id, configs, split}``). ``datasets`` is imported here, inside the functions, so importing
pods.tasks stays cheap. Offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, or the hub unreachable), a hub
id fails at once with a message saying which keys take local files.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from pods.errors import ConfigError
from pods.tasks.base import Example

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_TRUE = {"1", "true", "yes", "on"}


def load_split(ds, split: str) -> tuple[list[dict], str]:
    """(records, where they came from) for split "train" or "test" of the dataset section ``ds``; ([], "none") if
    neither is set."""
    files = getattr(ds, f"{split}_files")
    if files:
        return load_files(files, key=f"dataset.{split}_files"), f"files:{files}"
    hub = getattr(ds, f"{split}_hub")
    if not hub:
        return [], "none"
    return load_hub(hub.model_dump(), split, name=ds.name), f"hub:{hub.id}"


def load_files(files, key: str) -> list[dict]:
    paths = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    for p in paths:
        if not Path(p).is_file():
            raise FileNotFoundError(f"{key}: file not found: {p}")
    kinds = {_FORMATS.get(Path(p).suffix.lower()) for p in paths}
    if None in kinds or len(kinds) != 1:
        raise ConfigError(f"{key}: expected files all of one type among {sorted(_FORMATS)}, got {paths}")
    empty = [p for p in paths if empty_file(p)]
    if empty:
        raise ConfigError(f"{key}: {empty[0]} is empty (no records)")
    import datasets

    try:
        ds = datasets.load_dataset(kinds.pop(), data_files=[str(p) for p in paths], split="train")
    except Exception as e:  # noqa: BLE001 - malformed json/csv/parquet: the library's reason, in one line
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"{key}: cannot read {', '.join(map(str, paths))} ({type(e).__name__}: {reason})") from None
    if len(ds) == 0:
        raise ConfigError(f"{key}: {', '.join(map(str, paths))} holds no records")
    return ds.to_list()


def empty_file(path) -> bool:
    """Nothing but white space in its first 4 KiB (an empty jsonl makes ``datasets`` raise a bare StopIteration)."""
    with open(path, "rb") as f:
        return not f.read(4096).strip()


def _offline_help(name: str, hub_id: str, split: str, reason: str, files_key: str | None = None) -> str:
    keys = f"{files_key}=/path/{split}.jsonl" if files_key else "dataset.train_files=/path/train.jsonl dataset.test_files=/path/test.jsonl"
    return (
        f"dataset '{name}': cannot load the {split} split of hub dataset '{hub_id}': {reason}. "
        f"Point the config at local files instead: {keys} (json, jsonl, parquet or csv; a hub copy can be exported "
        f"with Dataset.to_json/to_parquet, or the parquet files of a cached hub snapshot can be listed)."
    )


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy a direct connection proves nothing; let `datasets` try
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def load_hub(hub: dict, split: str, name: str, files_key: str | None = None) -> list[dict]:
    """All records of ``hub['split']`` (default: the split name) over ``hub['configs']`` (default: [None]).
    ``files_key``: the key that takes local files instead, named when the hub cannot be reached (default: the run's
    ``dataset.train_files``/``dataset.test_files``; ``pods-eval``: ``suite.benchmarks.<name>.files``)."""
    hub_id, configs = hub["id"], list(hub["configs"] or [None])
    offline = any(os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    import datasets

    if offline and not getattr(datasets.config, "HF_HUB_OFFLINE", False):
        # set after `datasets` was imported: it would still try the network (and retry for ~20 s)
        raise ConfigError(_offline_help(name, hub_id, split, "HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set", files_key))
    if not offline and not _hub_reachable():
        raise ConfigError(_offline_help(name, hub_id, split, "the hub is unreachable (no network?)", files_key))
    records = []
    for config in configs:
        try:
            ds = datasets.load_dataset(hub_id, config, split=hub["split"], data_dir=hub.get("data_dir"))
        except Exception as e:  # noqa: BLE001 - offline cache misses, network errors, unknown ids
            reason = f"{type(e).__name__}: {e}" + (" (offline mode, not in the local cache)" if offline else "")
            raise ConfigError(_offline_help(name, hub_id, split, reason, files_key)) from e
        records += ds.to_list()
    return records


def field(record: dict, names: tuple[str, ...], where: str):
    """The first of ``names`` present in the record; a clear error otherwise."""
    for n in names:
        if record.get(n) is not None:
            return record[n]
    raise ConfigError(f"{where}: none of the fields {list(names)} in record with keys {sorted(record)}")


def build_split(records: list[dict], ds, split: str, question_fields: tuple[str, ...], gold_fn) -> list[Example]:
    """Records -> Examples with the configured prompt format; ``{split}_size`` keeps the first N."""
    from pods.tasks.prompts import PROMPTS

    prompt = PROMPTS.get(ds.prompt_format)
    limit, name = getattr(ds, f"{split}_size"), ds.name
    out = []
    for i, rec in enumerate(records[: int(limit)] if limit else records):
        where = f"dataset '{name}' {split} record {i}"
        messages, text = prompt(str(field(rec, question_fields, where)))
        uid = str(rec.get("unique_id") or rec.get("id") or f"{name}/{split}/{i}")
        out.append(Example(messages=messages, gold=gold_fn(rec, where), id=uid, prompt_text=text))
    return out
