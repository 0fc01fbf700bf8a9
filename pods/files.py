"""Outputs written safely: whether a path can be written, asked before any work (``writable``), and files that are
written whole or not at all (``atomic``: a temporary file in the same folder, then ``os.replace``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from pods.errors import ConfigError


def writable(path: str | Path, what: str, directory: bool = False) -> Path:
    """``path`` as a ``Path`` when it can be written here: a file (or, with ``directory``, a folder) that exists or can
    be created; else ``ConfigError`` in one line naming ``what`` (the option). Creates nothing: a probe file is made
    and removed in the nearest folder that exists (``os.access`` says yes to root on a read-only file system)."""
    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        raise ConfigError(f"{what}: {path} is a {'file' if directory else 'directory'}, not a {'directory' if directory else 'file'}")
    base = path if path.is_dir() else path.parent
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise ConfigError(f"{what}: cannot create {path}: {base} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".pods-probe-")
    except OSError as e:
        raise ConfigError(f"{what}: cannot write {path}: making a file in {base} failed ({e.strerror})") from None  # the errno says why
    os.close(fd)
    os.unlink(probe)
    return path


@contextlib.contextmanager
def atomic(path: str | Path, mode: str = "w", **kw) -> Iterator[IO]:
    """``open(path, mode)`` for writing, written to a temporary file beside ``path`` and renamed onto it when the
    ``with`` body ends without an error: a failure (or a kill) leaves the old file as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, mode, **kw) as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have given
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
