"""``pods.files``: ``atomic`` leaves the old file when the writing fails, ``writable`` asks without creating anything."""

from __future__ import annotations

import pytest

from pods.errors import ConfigError
from pods.files import atomic, writable


def test_atomic_replaces_whole_or_leaves_the_old_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("old\n")
    with pytest.raises(RuntimeError), atomic(path) as f:
        f.write("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["t.csv"]  # no temporary file left
    with atomic(path) as f:
        f.write("new\n")
    assert path.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_writable_creates_nothing_and_names_the_option(tmp_path):
    assert writable(tmp_path / "a" / "b" / "out.csv", "--csv") == tmp_path / "a" / "b" / "out.csv"
    assert writable(tmp_path / "new", "--out", directory=True) == tmp_path / "new"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=r"^--out: .*/f is a file, not a directory$"):
        writable(tmp_path / "f", "--out", directory=True)
    with pytest.raises(ConfigError, match=r"^--csv: cannot create .*/f/x.csv: .*/f is a file, not a directory$"):
        writable(tmp_path / "f" / "x.csv", "--csv")
    with pytest.raises(ConfigError, match=r"is a directory, not a file$"):
        writable(tmp_path, "--csv")
