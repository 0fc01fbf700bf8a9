"""The producer thread works on its rank's GPU: a new thread starts on cuda:0, so without its own
``torch.cuda.set_device`` every rank's producer would launch kernels in device 0's context.

No GPU here: ``torch.cuda.current_device`` (the rank's device, as ``pods.distributed`` set it) and
``torch.cuda.set_device`` are recorded stand-ins; the thread that calls them and the device it sets are the producer's."""

from __future__ import annotations

import threading

import torch

from pods.distributed import Dist
from pods.loop.producer import Producer
from pods.loop.rollouts import Generation
from pods.schema import check
from support.config import compose


class Engine:
    version = 0


def test_the_producer_thread_sets_its_ranks_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append((threading.current_thread().name, d)))
    cfg = check(compose(["hardware.device=cuda", "train.max_staleness=1"]))
    producer = Producer(Generation(cfg, Engine(), Dist(), 1), source=None, weights=None, trainer=Dist(), version=0, next_batch=1)
    try:
        thread = producer.pool.submit(lambda: threading.current_thread().name).result()
    finally:
        producer.close()
    assert thread.startswith("pods-producer") and calls == [(thread, 3)]


def test_on_cpu_the_producer_thread_sets_no_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(d))
    cfg = check(compose(["train.max_staleness=1"]))
    producer = Producer(Generation(cfg, Engine(), Dist(), 1), source=None, weights=None, trainer=Dist(), version=0, next_batch=1)
    try:
        producer.pool.submit(lambda: None).result()
    finally:
        producer.close()
    assert calls == []
