"""Reading back a run's offline W&B files: wandb's own records (``.wandb``: protobuf ``Record``s in LevelDB-log
framing after a 7-byte W&B header), one ``Segment`` per start, and ``offline_history`` (every history row, in the
order ``wandb sync`` sends them). What ``pods.wandb_log`` writes is checked against this.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLOCK, CHUNK_HEADER, FILE_HEADER = 32 * 1024, 7, 7
FULL, LAST = 1, 4  # chunk types that end a record (2 = first, 3 = middle)


def records(path: str | Path) -> Iterator:
    """The ``wandb_internal_pb2.Record``s of one ``.wandb`` file, in order; stops quietly at a torn tail (what a
    killed writer leaves: wandb flushes the file in 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log")
    pos, parts = FILE_HEADER, []
    while pos + CHUNK_HEADER <= len(data):
        block_end = (pos // BLOCK + 1) * BLOCK
        if pos + CHUNK_HEADER > block_end:  # a block's tail too short for a chunk header is padding
            pos = block_end
            continue
        crc, size, kind = struct.unpack_from("<IHB", data, pos)
        payload = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + size]
        if (crc, size, kind) == (0, 0, 0) or len(payload) < size or zlib.crc32(bytes([kind]) + payload) != crc:
            return
        parts.append(payload)
        pos += CHUNK_HEADER + size
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


@dataclass
class Segment:
    """One start's offline directory: its run id, start time, history rows (in order) and whether it finished."""

    path: Path
    run_id: str | None
    start: float
    rows: list[dict]
    finished: bool

    @property
    def last_step(self) -> int:
        return max((r["_step"] for r in self.rows), default=-1)


def history_row(history) -> dict:
    """A ``HistoryRecord`` as the dict W&B shows (a table is a nested dict: ``row["completions"]["nrows"]``)."""
    row: dict = {}
    for item in history.item:
        *outer, last = list(item.nested_key) or [item.key]
        node = row
        for k in outer:
            node = node.setdefault(k, {})
        node[last] = json.loads(item.value_json)
    return row


def read_segment(path: Path) -> Segment:
    run_id, start, rows, finished = None, 0.0, [], False
    for file in sorted(path.glob("*.wandb")):
        for rec in records(file):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run_id, start = rec.run.run_id, rec.run.start_time.ToMicroseconds() / 1e6
            elif kind == "history":
                rows.append(history_row(rec.history))
            elif kind == "exit":
                finished = True
    return Segment(path, run_id, start, rows, finished)


def segments(run_dir: str | Path, run_id: str | None = None) -> list[Segment]:
    """The offline segments under ``<run_dir>/wandb/`` (of ``run_id`` if given), in start order: the order in
    which ``wandb sync`` uploads segments of one run."""
    found = [read_segment(p) for p in sorted(Path(run_dir, "wandb").glob("offline-run-*")) if p.is_dir() and not p.is_symlink()]
    return sorted((s for s in found if run_id is None or s.run_id == run_id), key=lambda s: s.start)


def offline_history(run_dir: str | Path, run_id: str | None = None) -> list[dict]:
    """Every history row the offline segments hold, in the order ``wandb sync`` sends them."""
    return [row for s in segments(run_dir, run_id) for row in s.rows]
