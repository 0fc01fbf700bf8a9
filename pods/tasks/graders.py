"""Correctness graders, by name: ``lenient`` (the paper's single-GPU check), ``math_verify``,
``math_verify_strict`` (open-r1's accuracy, the paper's 8-GPU runs) and ``boxed``.

Each is ``fn(completion, gold) -> (correct, extracted)``; ``gold`` is an already-extracted answer string.
Model text is only parsed, never evaluated: math-verify turns LaTeX into unevaluated sympy trees, and a
tree that could blow up when compared (power towers, huge exponents or factorials, thousands of nodes)
is compared as a string instead. Wall-clock limits live one level up (pods.tasks.guard): in a worker,
math-verify's own SIGALRM timeouts are switched off; called directly from the main thread they stay on.
"""

from __future__ import annotations

import math
import re
import threading
from functools import lru_cache

from pods.tasks.base import GRADERS
from pods.tasks.extract import TAIL_CHARS, after_hashes, answer_block, last_boxed, last_digits, same_answer

MAX_REGION_CHARS = 400  # math-verify parses at most this much text: LaTeX parsing time grows with length
# (about 1 s per 1000 characters here) and real final answers are short (MATH golds <= 50 characters)
MAX_NESTING = 40  # deeper bracket nesting than this is never handed to the LaTeX parser
MAX_NODES = 2_000
INNER_TIMEOUT_S: int | None = 5  # math-verify's own (signal) timeouts; None inside grading workers
_BASE_SUBSCRIPT = re.compile(r"\d\s*_\s*\{?\s*\d")


@GRADERS.register("lenient")
def grade_lenient(completion: str, gold: str) -> tuple[bool, str | None]:
    """The authors' single-GPU check (their release commit, which labelled the published runs): right if the
    <answer> block (the whole text when there is no tag), the last run of digits (``last_digits``: "70,000" -> "000",
    as theirs), or the whole text matches the gold after MATH-style normalisation. No sympy (the authors had it
    disabled too), and no \\boxed{} search outside the answer block: a completion whose only answer is a box in
    untagged text scores 0, as theirs (a box INSIDE the block is read by the normalisation)."""
    text = completion[-TAIL_CHARS:]
    shown = [answer_block(text), last_digits(text)]
    whole = [completion] if len(completion) <= 2 * len(gold) + 100 else []  # a long text never normalises to a short gold
    for cand in shown + whole:
        if same_answer(cand, gold):
            return True, cand
    return False, next((c for c in shown if c), None)


@GRADERS.register("math_verify")
def grade_math_verify(completion: str, gold: str) -> tuple[bool, str | None]:
    """math-verify's parse/verify on the answer region: the <answer> block if there is one, else the
    text after a GSM8K-style ``####``, else the last \\boxed{} (the same box the MATH gold comes from),
    else the end of the completion. A prediction whose extracted string normalises to the gold string
    also counts (answers such as ``\\text{(B)}`` that sympy cannot represent)."""
    tail = completion[-TAIL_CHARS:]
    region = answer_block(tail) or after_hashes(tail)
    if not region:
        box = last_boxed(tail)
        region = tail if box is None else "\\boxed{" + box + "}"
    pred = _parse(region[-MAX_REGION_CHARS:].replace("\\$", ""), boxed_first=True)  # math-verify drops "\\$18"
    extracted = next((p for p in reversed(pred) if isinstance(p, str)), None)
    return same_answer(extracted, gold) or _verify(gold, pred), extracted


@GRADERS.register("math_verify_strict")
def grade_math_verify_strict(completion: str, gold: str) -> tuple[bool, str | None]:
    """open-r1's accuracy as the authors' 8-GPU runs computed it: LaTeX extraction only (no plain numbers,
    no anchor-free matches), boxed first, over the whole completion, malformed operators and
    nits not repaired; extraction_mode first_match (math-verify tries the matches from the end of the text).
    The gold is parsed by math-verify's defaults (first match)."""
    text = completion[-TAIL_CHARS:]
    if not text.strip() or not _nesting_ok(text):
        return False, None
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    norm = NormalizationConfig(
        nits=False, malformed_operators=False, basic_latex=True, boxed="all", units=True
    )  # their equations=True: now the parser's default
    config = LatexExtractionConfig(normalization_config=norm, boxed_match_priority=0, try_extract_without_anchor=False)
    pred = parse(text, extraction_config=[config], extraction_mode="first_match", parsing_timeout=_inner_timeout())
    gold_parsed = _parse_gold_first(gold)
    extracted = next((p for p in reversed(pred) if isinstance(p, str)), None)
    if not pred or not gold_parsed or not all(_tame(p) for p in (*gold_parsed, *pred)):
        return False, extracted
    return bool(verify(list(gold_parsed), pred, timeout_seconds=_inner_timeout())), extracted


@lru_cache(maxsize=16384)
def _parse_gold_first(gold: str) -> tuple:
    from math_verify import parse

    return tuple(parse(gold, extraction_mode="first_match", parsing_timeout=_inner_timeout()))


@GRADERS.register("boxed")
def grade_boxed(completion: str, gold: str) -> tuple[bool, str | None]:
    """The last \\boxed{...} (or \\fbox) content, brace-matched; equal to the gold after normalisation
    or by math-verify. No box, no credit."""
    box = last_boxed(completion[-TAIL_CHARS:])
    if box is None:
        return False, None
    if same_answer(box, gold):
        return True, box
    if len(box) > MAX_REGION_CHARS:  # no real answer is this long; not worth a slow parse
        return False, box
    return _verify(gold, _parse("\\boxed{" + box + "}", boxed_first=True)), box


# --- math-verify with guards ------------------------------------------------------------------------


def _inner_timeout() -> int | None:
    if INNER_TIMEOUT_S is None or threading.current_thread() is not threading.main_thread():
        return None  # signal.alarm only works in the main thread
    return INNER_TIMEOUT_S


def _nesting_ok(text: str) -> bool:
    depth = 0
    for ch in text:
        if ch in "({[":
            depth += 1
            if depth > MAX_NESTING:
                return False
        elif ch in ")}]":
            depth = max(0, depth - 1)
    return True


def _parse(text: str, boxed_first: bool) -> list:
    if not text.strip() or not _nesting_ok(text):
        return []
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    configs = [LatexExtractionConfig(boxed_match_priority=0 if boxed_first else 50), ExprExtractionConfig()]
    return parse(text, extraction_config=configs, parsing_timeout=_inner_timeout())


@lru_cache(maxsize=16384)
def _parse_gold(gold: str) -> tuple:
    from math_verify import LatexExtractionConfig, parse

    return tuple(parse("\\boxed{" + gold + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=_inner_timeout()))


def _verify(gold_text: str, pred: list) -> bool:
    """math-verify equivalence of the gold string and a parsed prediction, when both are safe to compare.
    Numbers in a base (``52_8``) are left to string comparison: math-verify drops the subscript."""
    if _BASE_SUBSCRIPT.search(gold_text):
        return False
    gold = _parse_gold(gold_text)
    if not gold or not pred or not all(_tame(p) for p in (*gold, *pred)):
        return False
    from math_verify import verify

    return bool(verify(list(gold), pred, timeout_seconds=_inner_timeout()))


def _log10_size(e) -> float:
    """Rough upper bound on the number of decimal digits of a symbol-free subtree (0 for symbols)."""
    import sympy

    if e.is_Integer or e.is_Rational:
        return max(e.p.bit_length(), e.q.bit_length()) * 0.30103
    if e.is_Number:
        if e in (sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
            return 0.0
        try:
            return math.log10(max(1.0, abs(float(e))))
        except (OverflowError, TypeError, ValueError):
            return math.inf
    if isinstance(e, sympy.Pow):
        base, exp = e.args
        size = _log10_size(base)
        if exp.is_Number:
            return size * abs(float(exp)) if size else 0.0
        exp_size = _log10_size(exp)
        return math.inf if exp_size > 6 else size * 10**exp_size
    if isinstance(e, (sympy.factorial, sympy.factorial2, sympy.gamma)):
        n = _log10_size(e.args[0])
        return math.inf if n > 5 else 10**n * max(n, 1.0)
    sizes = [_log10_size(a) for a in e.args]
    if isinstance(e, sympy.Mul):
        return sum(sizes)
    return max(sizes, default=0.0) + 1


def _tame(expr) -> bool:
    """False for sympy trees whose comparison could explode: numbers with more than 10^5 digits (power
    towers, huge factorials), high powers of expressions (expansion), unevaluated sums/integrals/limits,
    very large trees."""
    if isinstance(expr, str):
        return True
    import sympy

    calculus = _calculus_types()
    try:
        for n, node in enumerate(sympy.preorder_traversal(expr)):
            if n > MAX_NODES or isinstance(node, calculus):
                return False
            if isinstance(node, sympy.Pow) and not node.base.is_Number and node.exp.is_Number and abs(node.exp) > 100:
                return False
        return _log10_size(expr) <= 1e5
    except Exception:  # noqa: BLE001 - an odd object (a mutable matrix, nan, ...): not worth the risk
        return False


def _calculus_types() -> tuple:
    import sympy

    return (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit, sympy.Derivative)


def warm_up() -> None:
    """Called by grading workers: no signal timeouts (the parent's deadline rules), parser loaded."""
    global INNER_TIMEOUT_S
    INNER_TIMEOUT_S = None
    grade_math_verify("so \\boxed{\\frac{1}{2}}", "0.5")
    grade_boxed("\\boxed{1}", "1")
