"""The two KV measures under the released R-KV schedule, for response lengths like the release's (no model, seconds).

    python scripts/sparse_rl_release_kv.py          # writes results/cpu/sparse_rl/release_kv_measures.csv

The released script (slime/scripts/run-qwen2.5-3b-rkv.sh with sglang-kvc's radix_attention.need_compress) cuts a
sequence's retained set to 512 positions at decode steps that are multiples of 128, once the sequence is longer than
512 tokens, with rollouts of up to 4,096 tokens. ``cache_sizes`` is pods' engine under those settings
(``budget: 640, interval: 128, cadence: steps, compress_after: 512``; a test checks it against the engine's own
count). For a batch of rollouts whose response lengths are log-normal (sigma 0.6, a spread assumed, not read) with a
given mean, it writes per mean: the peak saving (pods' ``kv_saving``: 1 - sum of sparse peaks / sum of dense peaks),
the mean over rollouts of each one's peak saving, the KV token-step saving over the whole batch (the engine's
``kv_saving_token_steps``) and the share of rollouts ever compressed. The release's response lengths are not in its
code; the means below span what 1.5-7B models write on MATH-level problems with 4,096 tokens allowed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing pods

OUT = ROOT / "results" / "cpu" / "sparse_rl" / "release_kv_measures.csv"
RELEASE = {"budget": 640, "interval": 128, "compress_after": 512, "max_tokens": 4096}
MEANS = (400, 700, 1000, 1500, 2000)


def cache_sizes(prompt: int, completion: int, budget: int, interval: int, compress_after: int) -> tuple[list[int], bool]:
    """KV entries per layer held by the forward that produced each decoded token under ``cadence: steps`` (the engine's
    ``_due``: before feeding token t, at every ``interval``-th step once the sequence is longer than
    ``compress_after``, cut to ``budget - interval``), and whether the sequence was ever cut."""
    sizes, n, cut = [prompt], prompt, False
    for t in range(completion - 1):
        if (t + 1) % interval == 0 and prompt + t + 1 > compress_after and n > budget - interval:
            n, cut = budget - interval, True
        n += 1
        sizes.append(n)
    return sizes, cut


def measures(prompts: list[int], completions: list[int], budget: int, interval: int, compress_after: int) -> dict:
    """Both KV measures of one batch of rollouts (token counts; per-token bytes cancel in every ratio)."""
    runs = [cache_sizes(p, c, budget, interval, compress_after) for p, c in zip(prompts, completions)]
    dense = [list(range(p, p + c)) for p, c in zip(prompts, completions)]
    return {
        "kv_saving_peak": 1 - sum(max(s) for s, _ in runs) / sum(max(d) for d in dense),
        "kv_saving_peak_per_rollout_mean": statistics.fmean(1 - max(s) / max(d) for (s, _), d in zip(runs, dense)),
        "kv_saving_token_steps": 1 - sum(sum(s) for s, _ in runs) / sum(sum(d) for d in dense),
        "compressed_frac": statistics.fmean(cut for _, cut in runs),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=150, help="prompt tokens (the chat-formatted MATH question)")
    p.add_argument("--rollouts", type=int, default=1024, help="rollouts per batch (the release: 128 x 8)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    from pods.results.report import write_csv

    rng, rows = random.Random(0), []
    for mean in MEANS:
        lens = [min(RELEASE["max_tokens"], max(1, round(mean * rng.lognormvariate(-0.18, 0.6)))) for _ in range(args.rollouts)]
        m = measures([args.prompt] * len(lens), lens, RELEASE["budget"], RELEASE["interval"], RELEASE["compress_after"])
        rows.append({"mean_response": mean, "measured_mean": round(statistics.fmean(lens), 1), "prompt": args.prompt} | m)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    write_csv(rows, args.out, list(rows[0]))


if __name__ == "__main__":
    main()
