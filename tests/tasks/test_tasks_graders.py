"""Graders on a table of tricky answer formats, normalisation, reward recipes by hand, prompt formats."""

from __future__ import annotations

import pytest

from pods.tasks import GRADERS, RECIPES, score_batch
from pods.tasks.extract import answer_block, last_number, normalize
from pods.tasks.prompts import PROMPTS
from pods.tasks.recipes import pods_formatted, r1_formatted, think_answer_span

# (gold, completion, lenient, math_verify, boxed). lenient = string equality after MATH-style
# normalisation (so 1/2 = \frac{1}{2} = 0.5, but 2/4 and 0.25 = \frac14 are not claimed) of the answer block (the
# whole text without a tag) or the last run of digits, as the authors' release grader; math_verify and
# boxed add math-verify's symbolic equivalence; boxed gives no credit without a \boxed{}.
TABLE = [
    ("18", "<answer>18</answer>", True, True, False),
    ("18", "The answer is 18.0", False, True, False),  # lenient: the last digits are "0" (the authors' rule)
    ("18", r"\boxed{18.00}", True, True, True),
    ("18", r"\boxed{\$18}", True, True, True),
    ("18", "<answer>$18</answer>", True, True, False),
    ("18", "<answer>\n\\$18.00\n</answer>", True, True, False),
    ("18", "<answer>18 dollars</answer>", True, True, False),
    ("18", r"\boxed{18 \text{ dollars}}", True, True, True),
    ("18", "#### 18", True, True, False),
    ("18", r"\boxed{17}", False, False, False),
    ("18", "<answer>18</answer> hmm, or 19", True, True, False),
    ("18", "18", True, True, False),
    ("18", "", False, False, False),
    ("1800", "<answer>1,800</answer>", True, True, False),
    ("1800", r"\boxed{1,800}", True, True, True),
    ("-3", r"\boxed{-3}", True, True, True),
    ("-3", r"\boxed{3}", False, False, False),
    ("0.5", r"\boxed{\frac{1}{2}}", True, True, True),
    (r"\frac{1}{2}", r"\boxed{1/2}", True, True, True),
    (r"\frac{1}{2}", r"\boxed{0.5}", True, True, True),
    (r"\frac{1}{2}", r"\boxed{0.50}", False, True, True),  # lenient: \frac{1}{2} is not 0.50 as text, last digits "50"
    (r"\frac{1}{2}", r"\boxed{\dfrac12}", True, True, True),
    (r"\frac{1}{2}", r"\boxed{\tfrac{1}{2}}", True, True, True),
    (r"\frac{1}{2}", r"\boxed{2/4}", False, True, True),
    (r"\frac{1}{4}", r"\boxed{0.25}", False, True, True),
    (r"\frac{1}{6}", r"\boxed{\frac{1}{2}}", False, False, False),
    (r"\frac{\frac{1}{2}}{3}", r"\boxed{\frac{\frac{1}{2}}{3}}", True, True, True),
    (r"\sqrt{2}", r"\boxed{\sqrt2}", True, True, True),
    (r"\sqrt{2}", r"\boxed{2^{1/2}}", False, True, True),
    (r"3\sqrt{2}", r"\boxed{\sqrt{18}}", False, True, True),
    (r"\frac{\sqrt{3}}{2}", r"\boxed{\frac{\sqrt3}{2}}", True, True, True),
    ("x^2+1", r"\boxed{1+x^2}", False, True, True),
    ("(1,2)", r"\boxed{(1, 2)}", True, True, True),
    ("[-2, 7)", r"\boxed{[-2,7)}", True, True, True),
    ("[-2, 7)", r"\boxed{(-2,7)}", False, False, False),
    (r"90^\circ", r"\boxed{90}", True, True, True),
    (r"10\%", r"\boxed{10}", True, True, True),
    (r"\pi", r"\boxed{\pi}", True, True, True),
    (r"\text{(B)}", r"\boxed{\text{(B)}}", True, True, True),
    (r"\text{Monday}", r"\boxed{Monday}", True, True, True),
    ("52_8", r"\boxed{52_8}", True, True, True),
    ("52_8", r"\boxed{52_9}", False, False, False),  # math-verify alone would drop the base subscript
    ("7", r"\fbox{7}", True, True, True),
    ("18", "<think>a</think><answer>\\boxed{18}</answer>", True, True, True),
    ("5", "the answer is $5$.", True, True, False),
    (r"\frac{1}{2}", "So the answer is " * 20 + r"\boxed{\frac{1}{2}}", False, True, True),  # lenient: no tag, no box search
    ("70000", "The profit is $70,000.", False, True, False),  # lenient: last digits "000", as the authors
]


@pytest.mark.parametrize("column,grader", [(2, "lenient"), (3, "math_verify"), (4, "boxed")])
@pytest.mark.parametrize("row", TABLE, ids=[f"{g}|{c[:24]}" for g, c, *_ in TABLE])
def test_tricky_formats(row, column, grader):
    gold, completion = row[0], row[1]
    correct, extracted = GRADERS.get(grader)(completion, gold)
    assert correct is row[column], f"{grader}({completion!r}, gold={gold!r}) -> {correct}, extracted {extracted!r}"


def test_tricky_table_through_the_worker_pool_agrees():
    for column, grader in [(2, "lenient"), (3, "math_verify"), (4, "boxed")]:
        scores = score_batch([r[1] for r in TABLE], [r[0] for r in TABLE], "correctness", grader)
        assert [s.correct for s in scores] == [r[column] for r in TABLE]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("18", "18"),
        ("18.0", "18"),
        ("18.00", "18"),
        ("$18", "18"),
        ("\\$18", "18"),
        ("1,000", "1000"),
        ("1,\\!000", "1000"),
        ("1,2", "1,2"),
        ("0.5", "\\frac{1}{2}"),
        ("\\dfrac12", "\\frac{1}{2}"),
        ("x = 5", "5"),
        ("\\text{Devon}", "devon"),
        ("30^\\circ", "30"),
        ("5\\%", "5"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("-0.0", "0"),
    ],
)
def test_normalize(text, expected):
    assert normalize(text) == expected


def test_extractors():
    assert answer_block("<think>x</think><answer> 42 </answer>") == "42"
    assert answer_block("<answer>1</answer> then <answer>2 (cut off") == "2 (cut off"
    assert answer_block("no tags") is None
    assert last_number("costs $1,234.50, then -7.") == "-7"
    assert last_number("costs $1,234.50.") == "1234.50"
    assert last_number("none") is None


# ---- reward recipes, by hand -------------------------------------------------------------------------

RIGHT = lambda completion, gold: (True, gold)  # noqa: E731 - stand-in graders
WRONG = lambda completion, gold: (False, None)  # noqa: E731
GOOD = "<think>\nreason\n</think>\n<answer>\n18\n</answer>"


def test_think_answer_span_equals_the_authors_greedy_regex():
    import random
    import re

    pattern = re.compile(r"<think>.*</think>[ \n]?<answer>.*</answer>", re.DOTALL)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "x", "  "]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        m = pattern.search(text)
        assert think_answer_span(text) == (m.span() if m else None), text


def test_r1_formatted_equals_open_r1s_regex():
    import random
    import re

    pattern = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)
    pieces = ["<think>\n", "\n</think>\n", "<answer>\n", "\n<answer>\n", "\n</answer>", "\n", "x", "</think>", "<think>"]
    rng = random.Random(1)
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        assert r1_formatted(text) == (pattern.match(text) is not None), repr(text)


def test_pods_release():
    r = RECIPES.get("pods_release")
    assert r(GOOD, "18", RIGHT).terms == {"correct": 1.0, "format": 0.0, "tags": 0.0}  # bonuses only when wrong
    s = r(GOOD, "18", WRONG)
    assert s.terms == {"correct": 0.0, "format": pytest.approx(0.1), "tags": pytest.approx(0.1)} and s.formatted
    s = r("Sure! " + GOOD + " done", "18", WRONG)  # 11 characters outside the match
    assert s.terms["format"] == pytest.approx(0.1 - 0.011) and not s.formatted
    assert r("x" * 500 + GOOD, "18", WRONG).terms["format"] == 0.0  # clipped at 0, never negative
    assert r("<think><think></think>", "18", WRONG).terms == {"correct": 0.0, "format": 0.0, "tags": pytest.approx(0.025)}


@pytest.mark.parametrize("name,scale", [("pods_0c453d2", 0.01), ("pods_187f43b", 0.1), ("pods_head", 0.1)])
def test_pods_later_commits(name, scale):
    """0c453d2: format 0.01 x score, 0.0025 per tag; the head 187f43b: 0.1 and 0.025 (max 1.2)."""
    r = RECIPES.get(name)
    s = r(GOOD, "18", RIGHT)
    assert s.reward == pytest.approx(1.0 + scale + 4 * 0.25 * scale) and s.formatted
    assert r("ab" + GOOD, "18", WRONG).terms["format"] == pytest.approx(scale * (1 - 0.02))
    assert r("plain 18", "18", RIGHT).terms == {"correct": 1.0, "format": 0.0, "tags": 0.0}
    assert RECIPES.get("pods_3fc107e") is RECIPES.get("pods_release")


def test_open_r1():
    r = RECIPES.get("open_r1")
    s = r(GOOD, "18", RIGHT)
    assert s.terms == {"accuracy": 1.0, "format": 1.0, "tags": 1.0} and s.formatted and s.reward == 3.0
    s = r("<think>reason</think><answer>18</answer>", "18", RIGHT)  # no newlines: open-r1 gives neither
    assert s.terms == {"accuracy": 1.0, "format": 0.0, "tags": 0.0} and not s.formatted
    assert r("<think>\nx\n</think>\n", "18", WRONG).terms == {"accuracy": 0.0, "format": 0.0, "tags": 0.5}


def test_correctness_and_formatted():
    assert RECIPES.get("correctness")(GOOD, "18", RIGHT).terms == {"correct": 1.0}
    assert pods_formatted("\n" + GOOD + " \n") and not pods_formatted("hi " + GOOD)


def test_score_batch_in_process_and_in_workers_agree():
    completions = [GOOD, "<think>x</think> <answer>17</answer>", "\\boxed{18}", "nothing"]
    for recipe in ["pods_release", "pods_head", "open_r1", "correctness"]:
        a = score_batch(completions, ["18"] * 4, recipe, "lenient", timeout_s=None)
        b = score_batch(completions, ["18"] * 4, recipe, "lenient")
        assert a == b


# ---- prompt formats ----------------------------------------------------------------------------------


def test_prompt_formats():
    assert PROMPTS.names() == ["boxed", "open_r1", "pods_base", "pods_instruct", "question"]
    messages, text = PROMPTS.get("pods_instruct")("What is 2+2?")
    assert text is None and messages[1] == {"role": "user", "content": "What is 2+2?"}
    assert "correct your own mistakes" in messages[0]["content"] and "<answer>\nAnswer here.\n</answer>" in messages[0]["content"]
    messages, text = PROMPTS.get("pods_base")("What is 2+2?")
    assert text.endswith("Problem: What is 2+2?\nSolution: ") and "<think>" in text
    messages, _ = PROMPTS.get("open_r1")("q")
    assert messages[0]["content"].endswith("<think>\n...\n</think>\n<answer>\n...\n</answer>")
    with pytest.raises(ValueError, match="unknown prompt format 'nope'; valid: boxed, open_r1, pods_base"):
        PROMPTS.get("nope")


def test_dataset_yamls_name_registered_options():
    from pathlib import Path

    import yaml

    from pods.tasks import DATASETS

    for path in sorted((Path(__file__).resolve().parents[2] / "conf" / "dataset").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        assert cfg["name"] in DATASETS and cfg["recipe"] in RECIPES and cfg["grader"] in GRADERS, path.name
        if "prompt_format" in cfg:
            assert cfg["prompt_format"] in PROMPTS, path.name


# The authors' lenient check (hendrycks/PRM800K-style string normalisation, no sympy), on answers in every
# wrapper form a model writes inside <answer>: (completion answer, gold, verdict under the authors' rules; each
# verdict checked against their release grader, utils/grader.py + utils/data.py at commit 3fc107e).
AUTHORS_FORMS = [
    ("\\(\\frac{14}{3}\\)", "\\frac{14}{3}", True),  # inline math \( \)
    ("\\[ \\dfrac{14}{3} \\]", "\\frac{14}{3}", True),  # display math \[ \], \dfrac
    ("$\\frac{14}{3}$", "\\frac{14}{3}", True),
    ("$$\\tfrac{14}{3}$$", "\\frac{14}{3}", True),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("\\(\\boxed{7}\\)", "7", True),
    ("\\text{(B)}", "\\text{(B)}", True),
    ("90^\\circ", "90", True),
    ("90^{\\circ}", "90", True),
    ("5 \\text{ cm}", "5", True),  # units on the right
    ("x = 5", "5", True),  # short "x =" prefix
    ("12\\%", "12", True),
    ("\\$18.00", "18", True),
    ("1,000", "1000", True),  # thousands separator
    ("0.5", "\\frac{1}{2}", True),
    ("\\frac12", "\\frac{1}{2}", True),
    ("\\left( 3, 4 \\right)", "(3,4)", True),
    ("\\(\\frac{14}{5}\\)", "\\frac{14}{3}", False),  # wrong value in a correct wrapper
    ("\\(\\frac{14}{3}", "\\frac{14}{3}", True),  # unclosed delimiter: LaTeX-to-text drops it all the same
    ("(3, \\(\\frac{\\pi}{2}\\))", "\\left( 3, \\frac{\\pi}{2} \\right)", True),  # delimiters INSIDE the answer
    ("(3, $\\frac{\\pi}{2}$)", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("\\frac{14}{3}\\", "\\frac{14}{3}", True),  # a trailing backslash
    ("\\frac{14}{3} \\", "\\frac{14}{3}", True),
    ("\\frac{14}{5}\\", "\\frac{14}{3}", False),
    ("70,000", "70000", True),  # separators inside the answer block are fine; only the last-digits fallback cuts them
    ("$18", "18", True),  # GSM8K: dollar sign
    ("18 dollars", "18", True),  # GSM8K: the last number counts
    ("\\(18\\)", "18", True),
    ("17", "18", False),
    ("14/3", "\\frac{14}{3}", True),  # a/b -> \frac{a}{b}
    ("5 cm", "5", True),  # unit words are dropped
    ("3 hours", "3", True),
    ("\\text{Monday}", "monday", True),  # case-insensitive text answers
    ("\\(\\sqrt{2}\\)", "\\sqrt{2}", True),
    ("1.5 million", "1500000", False),  # "million" -> *10^6, but sympy was off: no match
]


@pytest.mark.parametrize("answer,gold,verdict", AUTHORS_FORMS, ids=[a for a, *_ in AUTHORS_FORMS])
def test_lenient_agrees_with_the_authors_rules(answer, gold, verdict):
    completion = f"<think>work</think>\n<answer>{answer}</answer>"
    assert GRADERS.get("lenient")(completion, gold)[0] is verdict


# open-r1's accuracy in the authors' 8-GPU runs: LaTeX only with an anchor ("answer is", \boxed), first match
# over the whole completion (math-verify orders matches from the end); plain numbers and bare inline math do not
# count. (completion, gold, verdict)
STRICT_FORMS = [
    ("<answer>18</answer>", "18", False),  # a plain number: no LaTeX, no credit
    ("The answer is $18$.", "18", True),
    ("<answer>\\boxed{18}</answer>", "18", True),
    ("so \\(x=3\\) then \\boxed{18}", "18", True),  # boxed first
    ("first $3$ then $18$", "18", False),  # no anchor
    ("\\boxed{17}", "18", False),
    ("The final answer is $\\frac{1}{2}$", "\\frac{1}{2}", True),
    ("The answer is $18$. Later: the answer is $17$.", "17", True),  # math-verify tries matches from the end
]


@pytest.mark.parametrize("completion,gold,verdict", STRICT_FORMS, ids=[c[:30] for c, *_ in STRICT_FORMS])
def test_math_verify_strict_is_open_r1s_accuracy(completion, gold, verdict):
    assert GRADERS.get("math_verify_strict")(completion, gold)[0] is verdict


def test_strict_gold_from_the_full_gsm8k_solution_is_the_answer_after_hashes():
    """The authors parsed the gold from the full solution text (first match); on the first 100 GSM8K test
    rows that is the number after '####', which is the gold our dataset passes."""
    import json

    from math_verify import parse

    from support.config import need_shared

    rows = [json.loads(line) for line in need_shared("data", "gsm8k", "test.jsonl").open()][:100]
    for r in rows:
        gold = r["answer"].split("####")[-1].strip().replace(",", "")
        assert str(parse(r["answer"], extraction_mode="first_match")[-1]) == gold
