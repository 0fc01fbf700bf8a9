"""One run of the command line validates its config once and decides its resume once, in its process (preflight, the
Hydra app and ``pods.loop.train`` together): counted on a one-step tiny run through ``pods.train.main(argv)``."""

from __future__ import annotations

import pytest

from support.runs import TINY_STEPS


def counting(monkeypatch, owner, name: str, counts: dict) -> None:
    """``owner.name`` wrapped so that every call is counted in ``counts[name]``."""
    real = getattr(owner, name)
    counts[name] = 0

    def counted(*args, **kwargs):
        counts[name] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def test_a_run_validates_once_and_decides_its_resume_once(tmp_path, monkeypatch):
    import pods.config
    import pods.resume
    import pods.train
    from pods.schema import Root

    counts: dict = {}
    counting(monkeypatch, pods.resume, "check", counts)  # module attributes: counted wherever they are called from
    counting(monkeypatch, pods.resume, "decide", counts)
    counting(monkeypatch, pods.config, "_algorithm", counts)  # runs once per pods.config.validate, however imported
    real = Root.model_validate.__func__
    counts["Root"] = 0

    def schema(cls, *args, **kwargs):  # the schema's validation of a whole config (pods.schema.check)
        counts["Root"] += 1
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(Root, "model_validate", classmethod(schema))
    pods.train.main([*TINY_STEPS, "train.max_steps=1", "train.prompts_per_step=1", f"hydra.run.dir={tmp_path / 'run'}"])
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    assert counts["Root"] == 1 and counts["decide"] == 1, counts  # one schema validation, one resume decision
    assert counts["check"] == 1, counts  # pods.loop.train's, which takes the decision preflight kept for it
    assert counts["_algorithm"] == 1, counts  # the cross-field rules (pods.config.validate) once


def test_the_loop_takes_a_validated_config_only(tmp_path):
    """``pods.loop.train`` refuses a plain dict in one line, before it looks at the run directory."""
    from pods.errors import ConfigError
    from pods.loop import train
    from support.config import compose

    with pytest.raises(ConfigError, match=r"pods.loop.train takes a validated config, not a dict: pass pods.config.validate\(cfg\)"):
        train(compose([]), tmp_path / "run")
    assert not (tmp_path / "run").exists()
