"""The end-of-run suite (``eval.suite``) in clean processes, shared over the run's ranks.

A training process is no place for a suite after several ranks trained: it holds the default process group (vLLM
would see it and join it with ``external_launcher``, over ranks that have exited: a hang until the gloo timeout), the
trainer's GPU memory and its CUDA context, and the other ranks' GPUs would idle through hours of generation. So at the
end every rank destroys the group (``pods.distributed.close``), then evaluates its share of the problems (every
world-th problem of each benchmark) in a fresh ``spawn`` process that has no launcher variables and sees only its own
GPU; rank 0 waits for every share's files under ``eval/<suite>/shards/<rank>/`` and merges them into
``eval/<suite>/``: each benchmark's metrics recomputed from the per-sample rows, as one process would compute them from
the same samples (the samples themselves are not those of one process: each share draws its own). A single process
evaluates in one clean process when the engine is vLLM, and in the training process itself otherwise, as before.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

from pods.eval.benchmarks import Suite, plan_for
from pods.eval.run import Options

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "ROLE_")
FAILED = "failed.txt"  # a share that failed: its one line


def clean_process(world: int, options: Options) -> bool:
    """Whether the suite runs in clean processes: after several ranks, or with vLLM (its own engine and memory)."""
    return world > 1 or options.engine == "vllm"


def share(data: dict[str, list], rank: int, world: int) -> dict[str, list]:
    """This rank's problems: every world-th of each benchmark from ``rank`` on; benchmarks it gets none of are left out."""
    parts = {name: examples[rank::world] for name, examples in data.items()}
    return {name: examples for name, examples in parts.items() if examples}


def clean_env(local_rank: int, device: str, env: dict | None = None) -> dict:
    """The environment of a share's process: no launcher variables (vLLM then starts as one process of its own), and on
    CUDA only this rank's GPU (``CUDA_VISIBLE_DEVICES``: its entry of the job's list, else its index)."""
    env = dict(os.environ if env is None else env)
    for key in list(env):
        if key in LAUNCHER_VARS or key.startswith(LAUNCHER_PREFIXES):
            del env[key]
    if device == "cuda":
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[local_rank] if local_rank < len(visible) else str(local_rank)
    return env


def _evaluate(suite: Suite, run_dir: str, options: Options, out: str, data: dict) -> None:
    """The body of a share's process: ``evaluate_suite`` on the run's final weights; a failure's line in ``FAILED``."""
    from pods.errors import ConfigError
    from pods.eval.run import evaluate_suite
    from pods.eval.weights import resolve

    try:
        evaluate_suite(suite, resolve(run_dir), options, Path(out), data)
    except (ConfigError, ValueError, OSError) as e:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / FAILED).write_text(f"{type(e).__name__}: {e}\n")
        sys.exit(1)


def run_share(suite: Suite, run_dir: str, options: Options, data: dict, out: Path, local_rank: int) -> int:
    """Evaluate ``data`` into ``out`` in a fresh process (see the module docstring); its exit code."""
    if not data:  # a rank with no problem left (tiny benchmarks, many ranks): an empty share
        out.mkdir(parents=True, exist_ok=True)
        (out / "samples.jsonl").write_text("")
        (out / "summary.json").write_text(json.dumps({"benchmarks": {}}) + "\n")
        return 0
    _free_gpu_memory()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_env(local_rank, options.device, saved))  # spawn gives the child os.environ as it is now
    try:
        proc = multiprocessing.get_context("spawn").Process(target=_evaluate, args=(suite, run_dir, options, str(out), data))
        proc.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    proc.join()
    return proc.exitcode


def _free_gpu_memory() -> None:
    """What the finished training left in this process's CUDA caching allocator, given back before a share starts."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def wait_for(parts: list[Path], poll_s: float = 2.0) -> None:
    """Until every share in ``parts`` has its summary; ``RuntimeError`` naming the first share that failed."""
    while True:
        failed = [p for p in parts if (p / FAILED).exists()]
        if failed:
            raise RuntimeError(f"share {failed[0].name} of the suite failed: {(failed[0] / FAILED).read_text().strip()}")
        if all((p / "summary.json").exists() for p in parts):
            return
        time.sleep(poll_s)


def _problems(rows: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """{benchmark: {problem_id: rows in sample order}}, problems in the order they were written."""
    out: dict[str, dict[str, list[dict]]] = {}
    for row in rows:
        out.setdefault(row["benchmark"], {}).setdefault(row["problem_id"], []).append(row)
    return out


def merge(suite: Suite, parts: list[Path], out: Path) -> dict:
    """The shares' rows as one evaluation in ``out`` (summary.json, table.md, samples.jsonl, config.json); the summary."""
    from pods.eval.metrics import Problem, benchmark_metrics, default_ks, macro_average
    from pods.eval.run import answer_key, table

    summaries = [json.loads((p / "summary.json").read_text()) for p in parts]
    shares = [_problems([json.loads(ln) for ln in (p / "samples.jsonl").read_text().splitlines() if ln.strip()]) for p in parts]
    per, lines = {}, []
    for name in suite.benchmarks:
        own = [list(s.get(name, {}).values()) for s in shares]  # share r holds problems r, r + world, ...
        ordered = [own[r][i] for i in range(max(map(len, own), default=0)) for r in range(len(own)) if i < len(own[r])]
        if not ordered:
            continue
        plan = plan_for(suite, name)
        problems = [Problem(tuple(r["correct"] for r in rows), tuple(answer_key(r["extracted"]) for r in rows)) for rows in ordered]
        parts_of = [s["benchmarks"][name] for s in summaries if name in s["benchmarks"]]
        rows_in = [p["problems"] * p["samples"] for p in parts_of]
        per[name] = {
            **benchmark_metrics(problems, plan.ks or default_ks(plan.samples)),
            "grader": parts_of[0]["grader"],
            "dropped_long_prompts": sum(p["dropped_long_prompts"] for p in parts_of),
            "max_tokens": parts_of[0]["max_tokens"],
            "mean_tokens": sum(p["mean_tokens"] * n for p, n in zip(parts_of, rows_in)) / max(1, sum(rows_in)),
        }
        lines += [json.dumps(r, ensure_ascii=False) for rows in ordered for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.jsonl").write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    macro = macro_average(per)
    (out / "table.md").write_text(table(per, macro))
    first = next(s for s in summaries if s["benchmarks"])
    config = json.loads((parts[summaries.index(first)] / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "shards": len(parts)}, indent=2) + "\n")
    summary = {k: first[k] for k in ("suite", "model", "weights", "prompt")} | {"benchmarks": per, "macro": macro}
    summary |= {"shards": len(parts), "seconds": max(s.get("seconds", 0.0) for s in summaries)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def clear(out: Path) -> None:
    """Shares (and a failure line) left by an earlier, interrupted attempt removed (rank 0, while the ranks can still
    wait for it)."""
    shutil.rmtree(out / "shards", ignore_errors=True)
    (out / FAILED).unlink(missing_ok=True)


def evaluate_shared(suite: Suite, run_dir: str, options: Options, data: dict, out: Path, where: tuple[int, int, int]) -> dict | None:
    """This rank's share in a clean process, then (rank 0) every share merged into ``out``; rank 0 returns the summary.
    ``where``: (rank, local rank, world) of the run that ended (its process group already destroyed)."""
    rank, local_rank, world = where
    if world == 1:  # one share: written where the suite's files go
        code = run_share(suite, run_dir, options, data, out, local_rank)
        if code != 0:
            failed = out / FAILED
            raise RuntimeError(failed.read_text().strip() if failed.exists() else f"the suite's process exited with {code}")
        return json.loads((out / "summary.json").read_text())
    parts = [out / "shards" / str(r) for r in range(world)]  # emptied by rank 0 before the group went (``clear``)
    code = run_share(suite, run_dir, options, share(data, rank, world), parts[rank], local_rank)
    if code != 0 and not (parts[rank] / FAILED).exists():
        parts[rank].mkdir(parents=True, exist_ok=True)
        (parts[rank] / FAILED).write_text(f"the process of share {rank} exited with {code}\n")
    if rank != 0:
        return None
    wait_for(parts)
    summary = merge(suite, parts, out)
    shutil.rmtree(out / "shards")
    return summary
