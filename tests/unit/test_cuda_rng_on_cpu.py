"""A checkpoint carries this process's CUDA generators when CUDA is in use, and a resume on as many devices puts them
back (GPU sampling draws from them: without them resume and rewind are exact on CPU only). A mock, for what needs a
GPU only: ``torch.cuda``'s availability, device count and generator states are stand-ins recorded here; the state
itself goes through the checkpoint's real save and ``weights_only`` load."""

from __future__ import annotations

import torch


def test_the_cuda_generators_are_saved_and_restored(monkeypatch, tmp_path):
    from pods.checkpoint import rng_state, set_rng_state

    cuda, restored = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)], []
    for name, value in (("is_available", True), ("is_initialized", True), ("device_count", 2)):
        monkeypatch.setattr(torch.cuda, name, lambda v=value: v)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [t.clone() for t in cuda])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: restored.append(states))
    torch.save(rng_state(), tmp_path / "rng.pt")
    state = torch.load(tmp_path / "rng.pt", weights_only=True)
    assert [t.tolist() for t in state["cuda"]] == [t.tolist() for t in cuda]
    set_rng_state(state)
    assert len(restored) == 1 and [t.tolist() for t in restored[0]] == [t.tolist() for t in cuda]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # another number of devices: left as they are
    set_rng_state(state)
    assert len(restored) == 1


def test_without_cuda_nothing_is_added():
    from pods.checkpoint import rng_state, set_rng_state

    if torch.cuda.is_available():
        return
    state = rng_state()
    assert "cuda" not in state
    set_rng_state(state)  # a CPU checkpoint restores as before
