"""Pulling answers out of text, and MATH-style string normalisation (no sympy, no evaluation).

Cheap, linear-time helpers shared by the datasets (gold extraction) and the graders (predicted answer).
Normalisation = latex2sympy2_extended's ``normalize_latex`` (the MATH/hendrycks rules: \\dfrac -> \\frac,
\\frac12 -> \\frac{1}{2}, 1/2 -> \\frac{1}{2}, 0.5 -> \\frac{1}{2}, \\left/\\right, units in \\text{...})
followed by a few plain-string steps it leaves out: inline-math delimiters (\\( \\), \\[ \\], $ $) around the
whole answer AND inside it (``(3, \\(\\frac{\\pi}{2}\\))``: the authors' grader turns LaTeX into text, which drops
every delimiter), a dangling backslash at the end (``\\frac{14}{3}\\``), $ and % signs, thousands separators, a
trailing period, "x = " prefixes, spaces, case, and one canonical spelling per decimal number (18.00 -> 18).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

TAIL_CHARS = 10_000  # graders look for the answer in the last this-many characters
MAX_NORMALIZE_CHARS = 2_000  # longer strings are compared raw (stripped), never normalised

_NUMBER = re.compile(r"-?\d+(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+")
_DIGITS = re.compile(r"\d+")
_PLAIN_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_TEXT_WRAP = re.compile(r"^\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}$")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_ASSIGN = re.compile(r"^[a-zA-Z]\s*=\s*(?=\S)")
_BOX = re.compile(r"\\(?:boxed|fbox)")
_MATH_DELIMS = re.compile(r"^\s*(?:\\\(|\\\[|\$\$?)\s*(.*?)\s*(?:\\\)|\\\]|\$\$?)\s*$", re.S)
_INNER_DELIMS = re.compile(r"(?<!\\)\\[()\[\]]|(?<!\\)\$")  # \( \) \[ \] $ anywhere (not "\\(" nor an escaped "\$")
_TRAILING_BACKSLASH = re.compile(r"(?<!\\)\\\s*$")  # one dangling "\" at the end (a "\\" line break is left alone)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, braces matched.

    ``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``; ``\\boxed 5`` -> ``5``; None when there is no box or
    the last one never closes (a truncated completion).
    """
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    i = m.end()
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{":  # "\boxed 5": one token, up to a space or a dollar sign
        token = re.match(r"[^\s$]+", text[i:])
        return token.group(0) if token else None
    depth = 0
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "{" and text[j - 1] != "\\":
            depth += 1
        elif ch == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def answer_block(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` (to the end of the text if it was cut off)."""
    start = text.rfind("<answer>")
    if start < 0:
        return None
    start += len("<answer>")
    end = text.find("</answer>", start)
    return text[start : end if end >= 0 else len(text)].strip()


def after_hashes(text: str) -> str | None:
    """GSM8K reference style: the text after the last ``####``, up to the end of that line."""
    i = text.rfind("####")
    if i < 0:
        return None
    return text[i + 4 :].strip().split("\n", 1)[0].strip() or None


def last_number(text: str) -> str | None:
    """The last number in the text (sign, decimals and thousands separators kept, commas dropped)."""
    found = None
    for found in _NUMBER.finditer(text[-TAIL_CHARS:]):  # noqa: B007 - the last match is wanted
        pass
    return found.group(0).replace(",", "") if found else None


def last_digits(text: str) -> str | None:
    """The last run of digits in the text (no sign, no decimal point, no separators: ``"$70,000."`` -> ``"000"``).
    The PODS authors' "last integer" at their release commit, which labelled their published results."""
    found = None
    for found in _DIGITS.finditer(text[-TAIL_CHARS:]):  # noqa: B007 - the last match is wanted
        pass
    return found.group(0) if found else None


def canonical_number(s: str) -> str | None:
    """``"18.00"`` -> ``"18"``, ``"-0.50"`` -> ``"-0.5"``, ``"1,000"`` -> ``"1000"``; None if not a plain number."""
    s = _THOUSANDS.sub("", s.strip())
    if len(s) > 100 or not _PLAIN_NUMBER.fullmatch(s):
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    return "0" if d == 0 else format(d.normalize(), "f")


@lru_cache(maxsize=8192)
def normalize(answer: str) -> str:
    """MATH-style string normalisation of an answer (see the module docstring)."""
    s = answer.strip()
    if len(s) > MAX_NORMALIZE_CHARS:
        return s
    from latex2sympy2_extended.math_normalization import normalize_latex

    m = _MATH_DELIMS.match(s)  # \( x \), \[ x \], $ x $, $$ x $$ around the whole answer
    s = m.group(1) if m else s
    s = _TRAILING_BACKSLASH.sub("", _INNER_DELIMS.sub("", s))
    s = s.strip("$ ").replace("\\!", "").replace("\\,", "").replace("\\ ", " ")
    s = canonical_number(s) or s  # "0.50" -> "0.5", which normalize_latex then writes as \frac{1}{2}
    s = normalize_latex(s, _norm_config())
    m = _TEXT_WRAP.match(s)
    if m:
        s = m.group(1)
    s = _DEGREES.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = _THOUSANDS.sub("", s).strip().rstrip(".").strip()
    s = _ASSIGN.sub("", s)
    s = re.sub(r"\s+", "", s).lower()
    if s.startswith("{") and s.endswith("}") and s.count("{") == 1:
        s = s[1:-1]
    return canonical_number(s) or s


@lru_cache(maxsize=1)
def _norm_config():
    from latex2sympy2_extended.math_normalization import NormalizationConfig

    return NormalizationConfig(basic_latex=True, units=True, malformed_operators=True, nits=True, boxed="last", equations=False)


def same_answer(a: str | None, b: str | None) -> bool:
    """Equal after normalisation (both non-empty)."""
    if not a or not b:
        return False
    na, nb = normalize(a), normalize(b)
    return bool(na) and na == nb
