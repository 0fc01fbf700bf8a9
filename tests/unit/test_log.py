"""pods.log: rank 0 logs, other ranks only warn; without a logging configuration the messages reach stderr, with
one (Hydra's: console + train.log) they propagate to it and nothing is printed twice."""

from __future__ import annotations

import logging

from pods.log import get, setup


def test_rank_0_logs_other_ranks_only_warn(capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    setup(rank=0)
    get("pods.test").info("step one")
    setup(rank=1)
    get("pods.test").info("not shown")
    get("pods.test").warning("shown")
    assert capsys.readouterr().err.splitlines() == ["[pods.test] step one", "[pods.test] shown"]


def test_a_configured_root_logger_receives_the_records(tmp_path, monkeypatch):
    file = logging.FileHandler(tmp_path / "train.log")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    setup(rank=0)  # as a library first (own stderr handler) ...
    monkeypatch.setattr(logging.getLogger(), "handlers", [file])
    setup(rank=0)  # ... then Hydra configured the root: the own handler goes, records propagate
    get("pods.loop").info("resumed")
    file.close()
    assert (tmp_path / "train.log").read_text() == "resumed\n"
    assert not [h for h in logging.getLogger("pods").handlers if getattr(h, "_pods", False)]
