"""LUFFY's ``deepscaler.rewards.math_utils.utils`` under its names, on this package's bounded graders.

LUFFY's module graded with ``sympy_parser.parse_expr`` + ``simplify`` on model text; here the symbolic
check is ``answers_match`` (latex2sympy grammar, guarded trees, a time bound), so ``grade_answer_sympy`` and
``are_equal_under_sympy`` never evaluate model text as code. The string helpers (boxed extraction, tuple
splitting, the eval heuristics) keep LUFFY's behaviour.
"""

from __future__ import annotations

import re
from typing import Optional

from deepscaler.rewards.math_utils.equivalence import answers_match
from deepscaler.rewards.math_utils.extract import last_boxed_content
from deepscaler.rewards.math_utils.normalize import clean_answer, match_key

__all__ = [
    "BAD_REGEXES",
    "BAD_SUBSTRINGS",
    "TUPLE_CHARS",
    "are_equal_under_sympy",
    "count_unknown_letters_in_expr",
    "extract_answer",
    "extract_boxed_answer",
    "grade_answer_mathd",
    "grade_answer_sympy",
    "grade_answer_verl",
    "last_boxed_only_string",
    "mathd_normalize_answer",
    "remove_boxed",
    "should_allow_eval",
    "split_tuple",
]

# LUFFY's heuristics for expressions too risky to hand to SymPy (exponent towers and powers of 10+).
BAD_SUBSTRINGS = ["^{", "^("]
BAD_REGEXES = [r"\^[0-9]+\^", r"\^[0-9][0-9]+"]
TUPLE_CHARS = "()[]"
_THOUSANDS_COMMA = re.compile(r"(\d),(\d\d\d)($|\D)")


def mathd_normalize_answer(answer: Optional[str]) -> Optional[str]:
    """MATH's string normalisation of an answer (the comparison key of ``grade_answer_mathd``); None stays None."""
    if answer is None:
        return None
    return match_key(clean_answer(answer.strip()))


def grade_answer_mathd(given_answer: str, ground_truth: str) -> bool:
    """Equal after MATH's string normalisation."""
    given, truth = mathd_normalize_answer(given_answer), mathd_normalize_answer(ground_truth)
    return given is not None and given == truth


def grade_answer_sympy(given_answer: str, ground_truth: str) -> bool:
    """Symbolic / numeric equivalence (tuples, intervals, fractions, ...), bounded and without evaluating text."""
    if ground_truth is None or given_answer is None:
        return False
    return bool(answers_match(given_answer, ground_truth))


def are_equal_under_sympy(ground_truth_normalized: str, given_normalized: str) -> bool:
    """LUFFY's ``simplify(gt - given) == 0`` test, as this package's guarded equivalence check."""
    return grade_answer_sympy(given_normalized, ground_truth_normalized)


def count_unknown_letters_in_expr(expr: str) -> int:
    """Distinct letters of ``expr`` once ``sqrt`` and ``frac`` are removed."""
    return len({ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()})


def should_allow_eval(expr: str) -> bool:
    """LUFFY's gate before SymPy: at most two unknown letters, no exponent towers or big powers."""
    if count_unknown_letters_in_expr(expr) > 2:
        return False
    return not any(s in expr for s in BAD_SUBSTRINGS) and not any(re.search(r, expr) for r in BAD_REGEXES)


def _strip_thousands_commas(expr: str) -> str:
    while True:
        stripped = _THOUSANDS_COMMA.sub(r"\1\2\3", expr)
        if stripped == expr:
            return expr
        expr = stripped


def split_tuple(expr: str) -> list[str]:
    """Elements of a bracketed tuple / interval (``(1, 2)`` -> ``['1', '2']``); anything else is one element.
    Thousands separators (``1,000``) are not element separators."""
    expr = _strip_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in TUPLE_CHARS
        and expr[-1] in TUPLE_CHARS
        and not any(c in inner for c in TUPLE_CHARS)
    ):
        return [e.strip() for e in inner.split(",")]
    return [expr]


def last_boxed_only_string(string: str) -> Optional[str]:
    """The last ``\\boxed{...}`` (else ``\\fbox{...}``) of ``string``, command included; None without one."""
    start = string.rfind("\\boxed")
    if start < 0:
        start = string.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(string)):
        if string[i] == "{":
            depth += 1
        elif string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[start : i + 1]
    return None


def remove_boxed(s: Optional[str]) -> Optional[str]:
    """``\\boxed{X}`` -> ``X``; None for anything else."""
    left = "\\boxed{"
    if not isinstance(s, str) or not s.startswith(left) or not s.endswith("}"):
        return None
    return s[len(left) : -1]


def extract_boxed_answer(solution: str) -> Optional[str]:
    """Content of the last ``\\boxed{}``, or None."""
    return remove_boxed(last_boxed_only_string(solution))


def extract_answer(passage: str) -> Optional[str]:
    """The boxed answer of a passage (None when nothing is boxed)."""
    if "\\boxed" not in passage:
        return None
    return last_boxed_content(passage)


def grade_answer_verl(solution_str: str, ground_truth: str) -> bool:
    """LUFFY's verl-style check: the solution's boxed answer against the (boxed or plain) ground truth,
    by MATH normalisation or symbolic equivalence."""
    if not ground_truth:
        return False
    if "\\boxed" in ground_truth:
        ground_truth = extract_answer(ground_truth)
    given = extract_answer(solution_str)
    if given is None or ground_truth is None:
        return False
    return grade_answer_mathd(given, ground_truth) or grade_answer_sympy(given, ground_truth)
