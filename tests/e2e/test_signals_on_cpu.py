"""Pre-emption: a signal makes the loop checkpoint at the next step boundary, then run the displaced handler."""

from __future__ import annotations

import os
import signal

from pods.metrics import read_metrics
from pods.signals import StopFlag
from support.config import compose, shrink


def test_stop_flag_defers_the_previous_handler_until_after_the_checkpoint():
    calls = []
    old = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        flag = StopFlag().install()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.requested and calls == []  # nothing exits before the checkpoint
        flag.after_checkpoint()
        assert calls == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGUSR2) is not None and not flag._deferred
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_a_ctrl_c_after_a_ctrl_cs_checkpoint_ends_in_one_line_with_130(capfd):
    """A second Ctrl-C that lands after the first one's checkpoint (a fast step) ends the run in one line, not with
    Python's KeyboardInterrupt traceback; after a SIGTERM's checkpoint Ctrl-C is Python's own again."""
    import pytest

    old = signal.getsignal(signal.SIGINT)
    try:
        flag = StopFlag().install()
        with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C mid-step: abort now (pods.train's one line)
            os.kill(os.getpid(), signal.SIGINT), os.kill(os.getpid(), signal.SIGINT)
        flag.after_checkpoint()
        with pytest.raises(SystemExit) as end:
            os.kill(os.getpid(), signal.SIGINT)
        assert end.value.code == 130 and capfd.readouterr().err.splitlines()[-1].startswith(
            "pods: interrupted (Ctrl-C) again after the checkpoint"
        )
        signal.signal(signal.SIGINT, old)
        flag = StopFlag().install()
        os.kill(os.getpid(), signal.SIGTERM)
        flag.after_checkpoint()
        assert signal.getsignal(signal.SIGINT) is old
    finally:
        signal.signal(signal.SIGINT, old)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_signal_mid_run_checkpoints_and_resume_continues(tiny_dir, tmp_path, monkeypatch):
    import pods.loop.run as loop  # where Run.step finds rollout_step
    from pods.config import validate

    real = loop.rollout_step
    count = {"n": 0}

    def step_then_signal(*a, **k):
        row = real(*a, **k)
        count["n"] += 1
        if count["n"] == 2:
            os.kill(os.getpid(), signal.SIGUSR1)  # SLURM's --signal=USR1@grace during step 2
        return row

    monkeypatch.setattr(loop, "rollout_step", step_then_signal)
    cfg = shrink(compose(["algorithm.n=4", "algorithm.m=2"]), steps=10)
    loop.train(validate(cfg), tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")] == [1, 2]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000002.pt"
    monkeypatch.setattr(loop, "rollout_step", real)
    loop.train(validate(shrink(compose(["algorithm.n=4", "algorithm.m=2", "train.resume=auto"]), steps=4)), tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")] == [1, 2, 3, 4]
