"""The real task data (``data/`` of the shared directory, PODS_SHARED): every GSM8K test gold and every MATH
gold graded by every grader, gold extraction with brace matching, loading through the real `datasets` json
loader, offline failures.

How a reference solution is graded as a completion: GSM8K solutions end in "#### x"; for the ``boxed``
grader (which needs a box by design) that line is rewritten as "\\boxed{x}". MATH solutions are used as
they are. A wrong answer = the solution up to its final answer with that answer replaced by gold + 1
(numbers) or with its last digit bumped (expressions), e.g. \\frac{1}{2} -> \\frac{1}{3}.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from pods.tasks import DATASETS, score_batch
from pods.tasks.extract import canonical_number, last_boxed
from pods.tasks.gsm8k import gsm8k_gold
from pods.tasks.mathds import math_gold
from support.config import need_shared

GRADERS = ["lenient", "math_verify", "boxed"]
CONF = Path(__file__).resolve().parents[2] / "conf" / "dataset"


@pytest.fixture(scope="module")
def shared() -> Path:
    """The shared task data (``data/`` of conftest's shared directory); skips, naming the missing file, without it."""
    for task in ("gsm8k", "math"):
        need_shared("data", task, "test.jsonl")
    return need_shared("data")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wrong_answer(gold: str) -> str:
    number = canonical_number(gold)
    if number is not None:
        return str(Decimal(number) + 1)
    digits = list(re.finditer(r"\d", gold))
    if digits:
        i = digits[-1].start()
        return gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1 :]
    return gold + "+1"


@pytest.fixture(scope="module")
def gsm8k(shared):
    rows = _rows(shared / "gsm8k" / "test.jsonl")
    return [r["answer"] for r in rows], [gsm8k_gold(r["answer"]) for r in rows]


@pytest.fixture(scope="module")
def math_rows(shared):
    rows = _rows(shared / "math" / "test.jsonl")
    return [r["solution"] for r in rows], [math_gold(r) for r in rows]


def _as_completion(solution: str, answer: str, grader: str) -> str:
    """A GSM8K solution whose "#### x" line says ``answer``: boxed for the boxed grader, in the answer tags the
    training prompt asks for for ``lenient`` (which, as the authors' grader, scores an untagged completion by its
    last number, so "#### 1,200" would read 200)."""
    head = solution[: solution.rfind("####")]
    if grader == "lenient":
        return head + "<answer>\n" + answer + "\n</answer>"
    return head + ("\\boxed{%s}" % answer if grader == "boxed" else "#### " + answer)


def _tagged(solution: str, grader: str) -> str:
    """A MATH solution as a completion of the training prompt: ``lenient`` reads the <answer> block."""
    if grader != "lenient":
        return solution
    box = solution.rfind("\\boxed")
    return solution[:box] + "<answer>\n" + solution[box:] + "\n</answer>"


def test_gsm8k_golds_are_clean_numbers(gsm8k):
    _, golds = gsm8k
    assert len(golds) == 1319
    assert all(g and canonical_number(g) is not None and "," not in g for g in golds)


@pytest.mark.parametrize("grader", GRADERS)
def test_every_gsm8k_gold_solution_is_correct_and_gold_plus_one_is_not(gsm8k, grader):
    solutions, golds = gsm8k
    right = [s if grader not in ("boxed", "lenient") else _as_completion(s, g, grader) for s, g in zip(solutions, golds)]
    scores = score_batch(right, golds, "correctness", grader)
    failed = [(g, s.extracted) for g, s in zip(golds, scores) if not s.correct]
    assert not failed, f"{len(failed)} of {len(golds)} GSM8K golds graded wrong by {grader}: {failed[:5]}"
    wrong = [_as_completion(s, wrong_answer(g), grader) for s, g in zip(solutions, golds)]
    accepted = [(g, s.extracted) for g, s in zip(golds, score_batch(wrong, golds, "correctness", grader)) if s.correct]
    assert not accepted, f"{grader} accepted gold+1: {accepted[:5]}"


def test_math_golds_extracted_intact(math_rows):
    solutions, golds = math_rows
    assert len(golds) == 500
    for solution, gold in zip(solutions, golds):
        depth = 0
        for ch in re.sub(r"\\[{}]", "", gold):  # escaped \{ \} are set braces, not grouping
            depth += {"{": 1, "}": -1}.get(ch, 0)
            assert depth >= 0, gold
        assert depth == 0, f"unbalanced gold {gold!r}"
        assert ("\\boxed{" + gold) in solution.replace("\\boxed {", "\\boxed{") or ("\\fbox{" + gold) in solution
    nested = [g for g in golds if re.search(r"\\(d?frac|sqrt|text)\{", g)]
    assert len(nested) > 50  # the authors' cut at the first "}" would have broken all of these
    first_brace_cut = [s.split("\\boxed{")[-1].split("}")[0] for s in solutions]
    assert sum(a != b for a, b in zip(first_brace_cut, golds)) > 50


def test_boxed_extraction_matches_braces():
    assert last_boxed(r"so $\boxed{\frac{1}{2}}$ and more") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \boxed{\sqrt{\frac{a}{b}} + \text{cm}}") == r"\sqrt{\frac{a}{b}} + \text{cm}"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"\boxed 5$") == "5"
    assert last_boxed(r"\boxed{\frac{1}{2}") is None  # never closed: no answer rather than a wrong one
    assert last_boxed("no box") is None


@pytest.mark.parametrize("grader", GRADERS)
def test_every_math_gold_solution_is_correct_and_a_changed_answer_is_not(math_rows, grader):
    solutions, golds = math_rows
    scores = score_batch([_tagged(s, grader) for s in solutions], golds, "correctness", grader)
    failed = [(g, s.extracted) for g, s in zip(golds, scores) if not s.correct]
    assert not failed, f"{len(failed)} of {len(golds)} MATH golds graded wrong by {grader}: {failed[:5]}"
    wrong = [_tagged(s[: s.rfind("\\boxed")] + "\\boxed{" + wrong_answer(g) + "}", grader) for s, g in zip(solutions, golds)]
    accepted = [(g, wrong_answer(g)) for g, s in zip(golds, score_batch(wrong, golds, "correctness", grader)) if s.correct]
    assert not accepted, f"{grader} accepted changed answers: {accepted[:5]}"


# ---- loading ------------------------------------------------------------------------------------------


def _cfg(name: str, **overrides):
    """The dataset section as a run composes it (the schema's defaults under the YAML), with overrides, validated as
    the run's (a builder reads a section's attributes)."""
    from pods.schema import HubDataset
    from support.config import compose

    return HubDataset.of({**compose([f"dataset={name}"])["dataset"], **overrides})


def test_gsm8k_loads_from_local_jsonl_with_the_datasets_loader(shared):
    data = DATASETS.get("gsm8k")(
        _cfg("gsm8k", train_files=str(shared / "gsm8k" / "train.jsonl"), test_files=[str(shared / "gsm8k" / "test.jsonl")])
    )
    assert (len(data.train), len(data.test)) == (7473, 1319)
    ex = data.test[0]
    assert ex.gold == "18" and ex.prompt_text is None
    assert ex.messages[0]["role"] == "system" and "<think>" in ex.messages[0]["content"]
    assert ex.messages[1] == {"role": "user", "content": _rows(shared / "gsm8k" / "test.jsonl")[0]["question"]}


def test_math_loads_from_local_jsonl_with_boxed_golds_and_base_prompt(shared):
    path = str(shared / "math" / "test.jsonl")
    data = DATASETS.get("math")(_cfg("math", train_files=path, test_files=path, prompt_format="pods_base", test_size=10))
    assert (len(data.train), len(data.test)) == (500, 10)
    assert data.test[0].gold == r"(\tfrac{27}{8}, \tfrac{15}{8})"
    assert data.test[0].prompt_text.endswith("\nSolution: ") and "Problem: Let $A = (0, 0)" in data.test[0].prompt_text


def test_missing_local_file_names_the_file_and_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset\.test_files: file not found: .*nope\.jsonl"):
        DATASETS.get("gsm8k")(_cfg("gsm8k", train_files=None, test_files=str(tmp_path / "nope.jsonl"), train_hub=None))


def test_record_without_gold_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no hashes here"}) + "\n")
    with pytest.raises(ValueError, match="record 0: no '####'"):
        DATASETS.get("gsm8k")(_cfg("gsm8k", train_files=str(bad), test_files=str(bad)))


@pytest.mark.parametrize("name", ["gsm8k", "math", "math500", "amc23"])
def test_hub_id_offline_fails_fast_and_says_how_to_use_local_files(monkeypatch, name):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError) as err:
        DATASETS.get(name)(_cfg(name))
    assert "dataset.train_files" in str(err.value) and "dataset.test_files" in str(err.value)


def test_importing_tasks_does_not_import_datasets_or_sympy():
    import subprocess
    import sys

    code = "import sys, pods.tasks; print('datasets' in sys.modules, 'sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_group_repeats_gives_each_rank_one_prompt_repeated_in_its_groups():
    """train.group_repeats = prompts_per_step (the authors' 8-GPU batches): every rank's step is ONE prompt in
    all its groups, ranks take distinct prompts, and successive steps walk the shuffled order without gaps."""
    from pods.data import PromptSampler

    world, steps = 4, 5
    samplers = [PromptSampler(50, 16, seed=3, rank=r, world=world, repeats=16) for r in range(world)]
    seen = []
    for _ in range(steps):
        per_rank = [s.next() for s in samplers]
        assert all(len(p) == 16 and len(set(p)) == 1 for p in per_rank)
        assert len({p[0] for p in per_rank}) == world  # one distinct prompt per rank
        seen += [p[0] for p in per_rank]
    plain = PromptSampler(50, 1, seed=3, rank=0, world=1)
    assert seen == [plain.next()[0] for _ in range(world * steps)]  # the same order as one prompt per step
    pods = PromptSampler(50, 4, seed=3, rank=1, world=2, repeats=2)
    step = pods.next()
    assert step[0] == step[1] != step[2] == step[3]  # 2 distinct prompts, each in 2 groups


def test_group_repeats_must_divide_prompts_per_step():
    from pods.config import ConfigError, validate
    from pods.data import PromptSampler
    from support.config import compose

    with pytest.raises(ValueError, match="group_repeats"):
        PromptSampler(10, 6, seed=0, repeats=4)
    with pytest.raises(ConfigError, match="train.group_repeats"):
        validate(compose(["train.prompts_per_step=6", "train.group_repeats=4"]))
    validate(compose(["train.prompts_per_step=6", "train.group_repeats=3"]))
