"""``python -m pods.memory [--card-gb G] <hydra overrides>``: the memory estimate of one run, as a table
(``make memory ARGS=...``); ``python -m pods.memory --all --out results/memory``: every GPU experiment in
conf/experiment/, one table each and ``estimates.csv`` (one row per experiment, with the largest micro-batch that
fits). The config is composed as ``pods.train`` composes it and completed by the schema; no other check runs
(a hub model need not be reachable here, nor 8 GPUs present).

Exit codes: 0 the estimate fits the card (or no card is known); 2 bad input (one line, before any estimate);
3 DOES NOT FIT: the estimate (with ``--all``: some experiment's) exceeds the card, the tables printed and written.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from pods.compose import CONF, compose
from pods.errors import ConfigError, need
from pods.files import atomic, writable
from pods.memory.estimator import Estimate, estimate, largest_fitting
from pods.plan import largest_micro_batch
from pods.schema import Root

COLUMNS = {  # CSV column -> the estimate's line(s) it sums (GB per GPU)
    "weights_gb": ("weights", "reference model (KL)"),
    "gradients_gb": ("gradients",),
    "optimizer_gb": ("optimizer state",),
    "zero_buffers_gb": ("ZeRO buffers",),
    "activations_gb": ("activations (saved)",),
    "layer_backward_gb": ("layer backward",),
    "loss_logits_gb": ("loss logits",),
    "reference_forward_gb": ("reference forward (KL)",),
}


def rows_per_step(cfg: Root) -> int:
    """The rows a rank trains per optimizer step (its largest micro-batch without a size limit): no micro-batch is larger."""
    return largest_micro_batch(cfg.algorithm, cfg.train.prompts_per_step, 1 << 30)


def largest_fitting_micro_batch(cfg: Root, card: float) -> int | None:
    """The largest hardware.micro_batch_size that fits, up to ``rows_per_step`` (beyond it nothing grows)."""
    return largest_fitting(cfg, card, "hardware", "micro_batch_size", rows_per_step(cfg))


def row(name: str, cfg: Root, est: Estimate) -> dict:
    out = {"experiment": name, "model": est.model, "hardware": est.hardware, "engine": est.engine}
    out.update(micro_batch_size=est.micro_batch, tokens=est.tokens)
    out.update({col: round(est.gb(*names), 2) for col, names in COLUMNS.items()})
    out.update(update_gb=round(est.update_gb, 2), engine_gb=round(est.rollout_gb, 2), total_gb=round(est.total_gb, 2))
    out.update(card_gb=est.card_gb, fits=est.fits, largest_fitting_micro_batch=largest_fitting_micro_batch(cfg, est.card_gb))
    out["rows_per_step"] = rows_per_step(cfg)
    out["problem"] = est.problems[0] if est.problems else ""
    return out


def gpu_experiments() -> list[str]:
    return sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


DOES_NOT_FIT = 3  # the exit code when an estimate exceeds its card (0: fits, 2: bad input)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pods.memory",
        description=__doc__.split("\n\n")[0],
        epilog="exit codes: 0 fits (or no card known), 2 bad input, 3 DOES NOT FIT (with --all: some experiment)",
    )
    ap.add_argument("--all", action="store_true", help="every experiment with hardware.device=cuda")
    ap.add_argument("--out", type=Path, help="with --all: write OUT/estimates.csv")
    ap.add_argument("--card-gb", type=float, help="the card's memory in GB (default: hardware.gpu_memory_gb)")
    args, overrides = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        card = args.card_gb
        if card is not None:
            need(card > 0 and math.isfinite(card), f"--card-gb: a card's memory in GB is a positive number, got {card:g}")
        need(args.out is None or args.all, "--out: only --all writes a file (OUT/estimates.csv)")
        if args.out is not None:
            writable(args.out / "estimates.csv", "--out")
        if not args.all:
            est = estimate(compose(overrides, rules=False, job_name="memory"), args.card_gb)
            print(est.table())
            return DOES_NOT_FIT if est.fits is False else 0
        rows = []
        for name in gpu_experiments():
            cfg = compose([f"experiment={name}", *overrides], rules=False, job_name="memory")
            if cfg.hardware.device != "cuda":
                continue
            est = estimate(cfg, args.card_gb)
            print(f"== experiment={name}\n{est.table()}\n")
            rows.append(row(name, cfg, est))
    except (ConfigError, ValueError) as e:
        print(f"pods: config error: {e}", file=sys.stderr)
        return 2
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic(args.out / "estimates.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out / 'estimates.csv'} ({len(rows)} experiments)")
    return DOES_NOT_FIT if any(r["fits"] is False for r in rows) else 0
