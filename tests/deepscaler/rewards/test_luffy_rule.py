"""math_utils.luffy_rule / luffy_normalize: LUFFY's rule grader without eval, on hand-made cases.

The verdict-by-verdict comparison with LUFFY's code is test_luffy_grader_agreement.py; this file pins the
safety of the plain-text parser and the quirks of LUFFY's rule that decide verdicts.
"""

from __future__ import annotations

import pytest
import sympy

from deepscaler.rewards.math_utils.luffy_normalize import latex_to_text, mathd_normalize, sympy_normalize
from deepscaler.rewards.math_utils.luffy_rule import luffy_answers_match, luffy_boxed_answer, parse_plain
from deepscaler.rewards.math_utils.safe_parse import UnsafeExpression


@pytest.mark.parametrize(
    "code",
    [
        "__import__('os').system('touch /tmp/pwned')",
        "().__class__.__bases__",
        "lambda:1",
        "open('x')",
        "x.y",
        "[1,2]",
        "a=1",
        "1;2",
        "'s'",
        "f(x)(y)[0]",
    ],
)
def test_parse_plain_refuses_anything_but_arithmetic(code):
    with pytest.raises(ValueError):
        parse_plain(code)


def test_parse_plain_reads_what_parse_expr_reads():
    x = sympy.Symbol("x")
    assert parse_plain("3sqrt(13)") == 3 * sympy.sqrt(13)
    assert parse_plain("1/2x") == x / 2  # implicit multiplication binds like parse_expr's inserted '*'
    assert parse_plain("-2^2") == -4 and parse_plain("2^3x") == 8 * x
    assert parse_plain("2e27") == sympy.Float("2e27") and parse_plain("0.5") == sympy.Float("0.5")
    assert parse_plain("ab") == sympy.Symbol("a") * sympy.Symbol("b")  # split_symbols
    assert parse_plain("5!") == 120 and parse_plain("pi") == sympy.pi
    with pytest.raises(ValueError):
        parse_plain("023")  # Python (and so parse_expr) rejects leading zeros
    with pytest.raises(UnsafeExpression):
        parse_plain("(10^7)!")
    with pytest.raises(UnsafeExpression):
        parse_plain("9^(9^(9^9))")


def test_parse_expr_is_never_called(monkeypatch):
    import sympy.parsing.sympy_parser as sympy_parser

    def refuse(*args, **kwargs):
        raise AssertionError("parse_expr called")

    monkeypatch.setattr(sympy_parser, "parse_expr", refuse)
    monkeypatch.setattr(sympy, "sympify", refuse)
    assert luffy_answers_match("1.5", "\\frac{3}{2}") and luffy_answers_match("3\\sqrt{13}", "\\sqrt{117}")
    assert not luffy_answers_match("__import__('os')", "2")


def test_luffy_box_extraction():
    assert luffy_boxed_answer("a \\boxed{1} b \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert luffy_boxed_answer("\\fbox{3}") is None  # LUFFY unboxes only \boxed{
    assert luffy_boxed_answer("\\boxed 3") is None and luffy_boxed_answer("\\boxed{3") is None


def test_luffy_rule_quirks_that_decide_verdicts():
    assert luffy_answers_match("1.5", "\\frac{3}{2}")
    assert not luffy_answers_match("\\frac{6}{4}", "\\frac{3}{2}")  # unreduced fraction: only as written
    assert not luffy_answers_match("7\\times10^0", "7")  # an integer needs an integer string
    assert not luffy_answers_match("2, 1", "1, 2") and luffy_answers_match("(1,2)", "(1, 2)")
    assert luffy_answers_match("10^\\circ", "10") and luffy_answers_match("\\text{C}", "C")
    assert luffy_answers_match("c", "C")  # sympy normalisation lower-cases
    assert not luffy_answers_match("0.33", "\\frac{1}{3}")  # no tolerance: simplify(diff) == 0


def test_normalisers():
    assert mathd_normalize("\\dfrac12") == "\\frac{1}{2}" and mathd_normalize("x = 3/4") == "\\frac{3}{4}"
    assert mathd_normalize("5 \\text{ cm} \\text{ m}") == "5 \\text{ cm} \\text{ m}"  # LUFFY gives up: unchanged
    assert mathd_normalize("12 feet", oat=True) == "12"  # OAT's unit words
    assert latex_to_text("\\frac{a+b}{c}") == "a+b/c" and latex_to_text("\\sqrt{2}\\pi") == "sqrt(2)pi"
    assert latex_to_text("\\sin x") == "sinx" and latex_to_text("\\cot x") == "x"  # pylatexenc drops \cot
    assert sympy_normalize("1,000") == "1000" and sympy_normalize("\\text{7 3/4}") == "7+3/4"
