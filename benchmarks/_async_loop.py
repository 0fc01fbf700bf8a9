"""pods' GRPO 16/16 step in its two phases, for ``bench_async.py``'s overlap part: ``Loop`` (a backend, the live HF
engine, a copy of the policy one version behind and an engine on it) and ``producer``, the same producer in a child
process (spawned: its own interpreter, so no GIL is shared with the trainer)."""

from __future__ import annotations

import copy
import threading
import time

from _common import typed

GRPO = ["algorithm=grpo", "algorithm.n=16", "algorithm.m=16", "train.prompts_per_step=1", "sampling.max_tokens=16"]


class Loop:
    """pods' GRPO 16/16 step split in its two phases, on real components: ``produce`` (generate + score with an engine)
    and ``consume`` (advantages, the batch, the token stage, the update)."""

    def __init__(self):
        import torch

        from pods.backends import BACKENDS
        from pods.engines import ENGINES
        from pods.models import load_tokenizer, resolve_model_dir
        from pods.tasks import DATASETS, encode_prompts

        self.cfg = cfg = typed([*GRPO, "hardware.torch_threads=2", "train.sampler_gap_warn=1000"])  # the copy lags by design
        model_dir = resolve_model_dir(cfg.model)
        tok = load_tokenizer(model_dir)
        self.pad = tok.pad_token_id
        task = DATASETS.get(cfg.dataset.name)(cfg.dataset)
        self.ids, examples, _ = encode_prompts(task.train, tok, cfg.dataset.max_prompt_length)
        self.golds = [ex.gold for ex in examples]
        torch.manual_seed(0)
        self.backend = BACKENDS.get(cfg.hardware.backend)(model_dir, cfg)
        self.live = ENGINES.get("hf")(model_dir, tok, cfg.rollout, policy=self.backend.policy)  # the synchronous loop's
        self.copy = copy.deepcopy(self.backend.policy)  # the producer's weights: one version behind
        self.behind = ENGINES.get("hf")(model_dir, tok, cfg.rollout, policy=self.copy)
        self.gen, self.rng = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)

    def produce(self, engine):
        import torch

        from pods.loop.rollouts import generate_groups

        i = int(torch.randint(len(self.ids), (1,), generator=self.rng))
        return generate_groups(self.cfg, engine, [self.ids[i]], [self.golds[i]])

    def consume(self, groups) -> None:
        from pods import distributed, tokens
        from pods.backends import build_batch
        from pods.loop.rollouts import select_rows

        a, n = self.cfg.algorithm, self.cfg.algorithm.n
        _, adv = select_rows(a, groups.rewards, n, generator=self.gen, dist=distributed.SINGLE)
        rows = range(len(groups.completions))
        prompts = [groups.prompts[r // n] for r in rows]
        batch = build_batch(prompts, groups.completions, groups.logprobs, adv.tolist(), self.pad, groups=[r // n for r in rows])
        tokens.apply(batch, self.backend, a, 0.0, distributed.SINGLE)
        self.backend.update(batch, self.cfg.optim.lr)

    def sync_step(self, threads: int) -> tuple[float, float]:
        """Generate, then update, both at ``threads``; (generate s, update s)."""
        import torch

        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        groups = self.produce(self.live)
        t1 = time.perf_counter()
        self.consume(groups)
        return t1 - t0, time.perf_counter() - t1

    def overlap_step(self, pending):
        """The update on ``pending`` here while a thread generates the next batch with the copy; then the weights
        copied into it. Returns the next batch."""
        import torch

        box = {}

        def producer():
            torch.set_num_threads(1)  # the intra-op thread count is per thread (OpenMP)
            box["groups"] = self.produce(self.behind)

        torch.set_num_threads(1)
        th = threading.Thread(target=producer)
        th.start()
        self.consume(pending)
        th.join()
        self.copy.load_state_dict(self.backend.policy.state_dict())
        return box["groups"]


def producer(conn) -> None:
    """The child process: loads each weight dict it receives into its copy, generates and scores the next batch with
    it, sends the batch back; None stops it."""
    import torch

    torch.set_num_threads(1)
    loop = Loop()
    conn.send("ready")
    while (weights := conn.recv()) is not None:
        loop.copy.load_state_dict(weights)
        conn.send(loop.produce(loop.behind))


class Remote:
    """The trainer's side of ``producer``: ``start(weights)`` the next batch, ``result()`` it."""

    def __init__(self):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=producer, args=(child,), daemon=True)
        self.proc.start()
        assert self.conn.recv() == "ready"

    def start(self, weights) -> None:
        self.conn.send({k: v.detach().clone() for k, v in weights.items()})

    def result(self):
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=60)
