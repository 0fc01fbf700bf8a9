"""Figure 1 on this machine, on the CPU miniature's own model and task: where the asymmetry PODS exploits holds here.

    OMP_NUM_THREADS=1 python benchmarks/bench_figure1_cpu.py [--rollouts 16,32,64,128,256] [--repeats 8] --out results/cpu

1. Figure 1 in ``make gpu-check``'s format (``benchmarks/bench_gpu.py --models tiny --no-loop``, one process per
   measurement): the warm-started tiny model (``pods.tiny.ensure_tiny``), the toy task's prompts, completions of
   ``sampling.max_tokens`` (12) tokens. ``generation.csv``: HF generate, one rollout per distinct prompt, EOS ignored,
   ms per token against rollouts per batch (``--batches``); ``update.csv``: one ``LocalBackend.update`` step under
   ``hardware=cpu_mb16``'s settings on b sequences as one micro-batch (``--micro-batches``), full fine-tuning and
   LoRA, time and peak RSS above the step's start, then 2x the largest as two micro-batches; ``figure1.png``.
2. The per-step view, ``step.csv``: the loop's own step (``pods.loop.rollout_step``: generate, score, select,
   update) with the CPU experiments' settings (``experiment=toy_grpo_16_16_cpu`` / ``toy_pods_64_16_cpu``: HF engine,
   2 prompts per step, T = 1, 12 tokens, 1 torch thread, update in micro-batches of at most 16 with one optimizer
   step), for n = ``--rollouts`` rollouts per prompt: GRPO (update on all n; the same computation as GRPO-GA n in
   micro-batches of 16) and PODS n->16 (update on the 16 of max reward variance). Both arms get the same prompts and
   the same sampling seed at each (repeat, n), so they generate the same rollouts; the points are interleaved
   (n ascending then descending, arm order alternating), so load changes hit both arms alike, and the ratios are
   taken within one repeat, then the median over repeats. lr = 0: the policy stays the warm start throughout (an
   optimizer step costs the same at any lr), so every point generates from the same model, EOS as in training.
3. ``step_summary.csv`` (medians per n; ``pods_over_grpo``: PODS(n->16)'s step over GRPO(n)'s; ``pods_over_grpo16``:
   over GRPO 16/16's, the demo's comparison (b)), ``figure1_step.png`` ((a) seconds per step split into generation and
   update, GRPO and PODS side by side, against n; (b) update memory and time against sequences per micro-batch, the
   cap of 16 marked), ``summary.txt`` (bench_gpu's table, the per-step table, ``uptime`` before and after, threads).

``make figure1-cpu`` runs it with the defaults (216 s at load 2.1-2.5 on 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the CPU experiments' one torch thread (hardware=cpu_mb16), also in bench_gpu's processes
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_gpu  # noqa: E402  (puts the repository on sys.path)
from _common import compose  # noqa: E402

ARMS = {"GRPO": "toy_grpo_16_16_cpu", "PODS": "toy_pods_64_16_cpu"}
M = 16  # PODS keeps m = 16 per prompt, as in the CPU experiments


def arm_config(arm: str, n: int) -> dict:
    """The CPU experiment of ``arm`` with n rollouts per prompt (GRPO: m = n; PODS: m = 16), validated as train() does."""
    from pods.config import validate

    return validate(compose([f"experiment={ARMS[arm]}", f"algorithm.n={n}", *([f"algorithm.m={M}"] if arm == "PODS" else [])]))


def build(cfg: dict):
    """What ``pods.loop.train`` builds for the tiny model: backend, engine (sharing the policy), training prompts, golds."""
    import torch

    from pods.backends import BACKENDS
    from pods.engines import ENGINES
    from pods.models import load_tokenizer, resolve_model_dir
    from pods.tasks import DATASETS, encode_prompts

    torch.set_num_threads(int(cfg.hardware.torch_threads))
    ds = cfg.dataset
    model_dir = resolve_model_dir(cfg.model)
    tok = load_tokenizer(model_dir)
    ids, examples, _ = encode_prompts(DATASETS.get(ds.name)(ds).train, tok, ds.max_prompt_length)
    backend = BACKENDS.get(cfg.hardware.backend)(model_dir, cfg)
    engine = ENGINES.get(cfg.rollout.name)(model_dir, tok, cfg.rollout, policy=backend.policy)
    return backend, engine, ids, [ex.gold for ex in examples], tok.pad_token_id


def one_step(cfg: dict, built, prompts: list[int], seed: int) -> dict:
    """One ``rollout_step`` of ``cfg``'s algorithm on the given prompt indices; its timings and counts."""
    import torch

    from pods.distributed import SINGLE
    from pods.loop import rollout_step
    from pods.loop.learn import Trainer
    from pods.loop.rollouts import Generation, Source

    backend, engine, ids, golds, pad = built
    backend.alg = cfg.algorithm  # the arms differ in n, m and rule only (asserted in main), not in the loss
    torch.manual_seed(seed)  # both arms: the same rollouts
    t0 = time.perf_counter()
    select = torch.Generator().manual_seed(0)  # the random rule's stream (max_variance and all do not draw from it)
    source = Source.of_batch([ids[i] for i in prompts], [golds[i] for i in prompts], select)
    g, t = Generation(cfg, engine, SINGLE, backend.micro_batch_size), Trainer(cfg, backend, pad, SINGLE, engine)
    r = rollout_step(g, t, source, 0.0)
    keys = ("t_generate", "t_score", "t_select", "t_update", "t_sync", "tokens", "tokens_trained", "kept", "truncated", "zero_var_groups")
    return {**{k: r[k] for k in keys}, "step_s": time.perf_counter() - t0}


def measure_steps(rollouts: list[int], repeats: int, log=print) -> list[dict]:
    """Interleaved GRPO(n) / PODS(n->16) steps: ``repeats`` x len(rollouts) x 2 rows, after one warm-up step per arm."""
    cfgs = {(arm, n): arm_config(arm, n) for arm in ARMS for n in rollouts}
    strip = ("name", "n", "m", "rule")
    loss_keys = [{k: v for k, v in c.algorithm.model_dump().items() if k not in strip} for c in cfgs.values()]
    assert all(k == loss_keys[0] for k in loss_keys), "the arms' configs differ beyond n, m and rule: one backend cannot serve both"
    built = build(cfgs[("GRPO", rollouts[0])])
    G, micro = cfgs[("GRPO", rollouts[0])].train.prompts_per_step, built[0].micro_batch_size
    for arm in ARMS:  # warm-up: first-call allocations, the optimizer state
        one_step(cfgs[(arm, rollouts[0])], built, list(range(G)), 0)
    rows = []
    for rep in range(repeats):
        for i, n in enumerate(rollouts if rep % 2 == 0 else rollouts[::-1]):
            prompts, seed = random.Random(1000 * rep + n).sample(range(len(built[2])), G), 1000 * rep + n
            for arm in list(ARMS) if (rep + i) % 2 == 0 else list(ARMS)[::-1]:
                cfg = cfgs[(arm, n)]
                r = one_step(cfg, built, prompts, seed)
                m = cfg.algorithm.m
                rows.append({"arm": arm, "n": n, "m": m, "repeat": rep, "prompts": G, "rollouts": G * n, "trained": G * m,
                             "micro_batch": micro, "micro_batches": -(-G * m // micro), **r})  # fmt: skip
                log(f"[figure1_cpu] repeat {rep + 1}/{repeats} n={n:<4} {arm}: generate {r['t_generate']:.3f} s, "
                    f"update {r['t_update']:.3f} s ({G * m} sequences), step {r['step_s']:.3f} s")  # fmt: skip
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per n: median seconds per arm and phase, and the per-repeat ratios' medians (same repeat = same load)."""
    get = {(r["arm"], r["n"], r["repeat"]): r for r in rows}
    ns, reps = sorted({r["n"] for r in rows}), sorted({r["repeat"] for r in rows})
    med = statistics.median
    out = []
    for n in ns:
        g, p = [get[("GRPO", n, k)] for k in reps], [get[("PODS", n, k)] for k in reps]
        g16 = [get[("GRPO", ns[0], k)] for k in reps]
        gen = [r["t_generate"] for r in g + p]
        out.append({
            "n": n, "m": p[0]["m"], "rollouts_per_step": p[0]["rollouts"], "repeats": len(reps),
            "generate_s": med(gen), "generate_ms_per_rollout": 1e3 * med(gen) / p[0]["rollouts"],
            "grpo_update_s": med(r["t_update"] for r in g), "pods_update_s": med(r["t_update"] for r in p),
            "grpo_update_ms_per_seq": 1e3 * med(r["t_update"] for r in g) / g[0]["trained"],
            "grpo_step_s": med(r["step_s"] for r in g), "pods_step_s": med(r["step_s"] for r in p),
            "grpo_generate_share": med(r["t_generate"] / r["step_s"] for r in g),
            "pods_generate_share": med(r["t_generate"] / r["step_s"] for r in p),
            "pods_over_grpo": med(b["step_s"] / a["step_s"] for a, b in zip(g, p)),
            "pods_update_over_grpo": med(b["t_update"] / a["t_update"] for a, b in zip(g, p)),
            "pods_over_grpo16": med(b["step_s"] / a["step_s"] for a, b in zip(g16, p)) if ns[0] == M else float("nan"),
        })  # fmt: skip
    return out


def step_table(summary: list[dict]) -> str:
    lines = ["Per step (pods.loop.rollout_step, 2 prompts, HF engine, 1 thread; medians; ratios within a repeat):",
             "     n   rollouts  generate (ms/rollout)  update GRPO (n) / PODS (16)   step GRPO / PODS    PODS/GRPO  PODS/GRPO16"]  # fmt: skip
    for s in summary:
        lines.append(f"  {s['n']:>4} {s['rollouts_per_step']:>9}  {s['generate_s']:7.3f} s ({s['generate_ms_per_rollout']:5.2f})"
                     f"       {s['grpo_update_s']:7.3f} / {s['pods_update_s']:6.3f} s      {s['grpo_step_s']:6.3f} / {s['pods_step_s']:6.3f} s"
                     f"    {s['pods_over_grpo']:6.2f}x    {s['pods_over_grpo16']:6.2f}x")  # fmt: skip
    return "\n".join(lines) + "\n"


def figure(summary: list[dict], upd: list[dict], path: Path, title: str, cap: int) -> None:
    """(a) seconds per step, generation + update stacked, GRPO and PODS side by side per n; (b) update memory (solid)
    and seconds (dashed) against sequences per micro-batch, the CPU experiments' cap marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    x, w = range(len(summary)), 0.38
    for k, (arm, colour) in enumerate((("grpo", "tab:blue"), ("pods", "tab:orange"))):
        xs = [i + (k - 0.5) * w for i in x]
        gen, up = [s["generate_s"] for s in summary], [s[f"{arm}_update_s"] for s in summary]
        ax1.bar(xs, gen, w, color="lightgrey", edgecolor=colour, label="generation" if k == 0 else None)
        ax1.bar(xs, up, w, bottom=gen, color=colour, label=f"update {'GRPO: all n' if arm == 'grpo' else f'PODS: m = {M}'}")
    for i, s in zip(x, summary):
        top = s["generate_s"] + max(s["grpo_update_s"], s["pods_update_s"])
        ax1.annotate(f"{s['pods_over_grpo']:.2f}x", (i, top), ha="center", xytext=(0, 3), textcoords="offset points", fontsize=8)
    ax1.set_xticks(list(x), [str(s["n"]) for s in summary])
    ax1.set(xlabel="rollouts per prompt n (2 prompts per step)", ylabel="seconds per step")
    ax1.set_title("(a) step time: generation + update; label = PODS/GRPO step", fontsize=10)
    times = ax2.twinx()
    for ft, colour in (("full", "tab:green"), ("lora", "tab:purple")):
        rows = [r for r in upd if r["finetune"] == ft and r["status"] == "ok" and r["accum_steps"] == 1]
        ax2.plot([r["batch"] for r in rows], [r["mem_update_mib"] for r in rows], "o-", color=colour, label=ft)
        times.plot([r["batch"] for r in rows], [r["seconds"] for r in rows], "--", color=colour, alpha=0.5)
    ax2.axvline(cap, color="grey", ls=":", lw=1)
    ax2.annotate(f"hardware=cpu_mb16: micro-batches of {cap}", (cap, 0.6), xycoords=("data", "axes fraction"), xytext=(-4, 0),
                 textcoords="offset points", ha="right", fontsize=8)  # fmt: skip
    ax2.set(xlabel="sequences per micro-batch", ylabel="peak RSS above the step's start (MiB, solid)")
    ax2.set_xscale("log", base=2)
    ax2.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    times.set(ylabel="seconds per update step (dashed)")
    times.set_ylim(bottom=0)
    ax2.set_title("(b) policy update: one micro-batch", fontsize=10)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_csv(path: Path) -> list[dict]:
    def num(v: str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v

    with path.open() as f:
        return [{k: num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv=None) -> int:
    a = parse(argv)
    t0, load0 = time.perf_counter(), uptime()
    print(f"[figure1_cpu] {load0}; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}", flush=True)
    gpu_args = ["--device", "cpu", "--engine", "hf", "--models", "tiny", "--no-loop", "--out", a.out, "--name", a.name]
    gpu_args += ["--rollouts", bench_gpu._ints(a.batches), "--micro-batches", bench_gpu._ints(a.micro_batches)]
    rc = bench_gpu.main(bench_gpu.parse(gpu_args + (["--in-process"] if a.in_process else [])))
    out_dir = Path(a.out) / a.name
    rows = measure_steps(a.rollouts, a.repeats, log=lambda s: print(s, flush=True))
    import torch

    threads = torch.get_num_threads()
    summary = summarise(rows)
    bench_gpu.write_csv(out_dir / "step.csv", rows)
    bench_gpu.write_csv(out_dir / "step_summary.csv", summary)
    load1 = uptime()
    upd = read_csv(out_dir / "update.csv") if (out_dir / "update.csv").exists() else []
    cap = arm_config("GRPO", a.rollouts[0]).hardware.micro_batch_size
    title = f"cpu, the warm-started tiny model on the toy task; load average {load1.split('load average: ')[-1]}"
    figure(summary, upd, out_dir / "figure1_step.png", title, cap)
    text = step_table(summary) + (
        f"\nmachine: {os.cpu_count()} cores; torch threads {threads} (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}); "
        f"wall {time.perf_counter() - t0:.0f} s\n  uptime before: {load0}\n  uptime after:  {load1}\n"
    )
    with (out_dir / "summary.txt").open("a") as f:
        f.write("\n" + text)
    print(text, end="")
    print(f"[figure1_cpu] wrote {out_dir}")
    return rc


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = bench_gpu._int_list
    p.add_argument("--rollouts", type=ints, default=[16, 32, 64, 128, 256], help="rollouts per prompt n of the per-step view")
    p.add_argument("--repeats", type=int, default=8, help="steps per (n, arm), interleaved")
    p.add_argument("--batches", type=ints, default=[1, 2, 4, 8, 16, 32, 64, 128, 256], help="Figure 1(a): rollouts per generate batch")
    p.add_argument("--micro-batches", type=ints, default=[1, 2, 4, 8, 16, 32, 64, 128, 256], help="Figure 1(b): sequences per micro-batch")
    p.add_argument("--out", default="results/cpu", help="results go to OUT/NAME/")
    p.add_argument("--name", default="figure1_toy")
    p.add_argument("--in-process", action="store_true", help="bench_gpu's measurements in this process (faster; tests)")
    a = p.parse_args(argv)
    if a.rollouts[0] < M:
        p.error(f"--rollouts: PODS keeps m = {M} per prompt, so every n must be >= {M}; got {a.rollouts[0]}")
    if a.repeats < 1:
        p.error("--repeats: at least 1")
    return a


if __name__ == "__main__":
    sys.exit(main())
