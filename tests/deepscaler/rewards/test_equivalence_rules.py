"""Equivalence rules of the rule grader: tolerance, exactness, structure, normalisation."""

import sympy

from deepscaler.rewards.math_utils import answers_match, clean_answer, objects_equal, parse_answer


def test_decimals_compare_with_relative_tolerance_1e_6():
    assert answers_match("0.3333333", "\\frac{1}{3}")  # |diff| / value = 1e-7
    assert not answers_match("0.3333", "\\frac{1}{3}")  # 1e-4
    assert answers_match("1000000.5", "1000000.4999999")


def test_exact_values_compare_exactly_even_when_large():
    assert not answers_match("1000000000001", "1000000000000")
    assert answers_match("2^{10}", "1024")


def test_unreduced_fraction_is_wrong_unless_written_identically():
    assert not answers_match("\\frac{2}{4}", "\\frac{1}{2}")
    assert answers_match("\\frac{2}{4}", "\\frac{2}{4}")


def test_symbols_must_agree():
    assert not answers_match("2y", "2x")
    assert answers_match("x^2 - 1", "(x-1)(x+1)")


def test_objects_equal_on_parsed_structures():
    assert objects_equal(parse_answer("(1, 2]"), parse_answer("(1, 2]"))
    assert not objects_equal(parse_answer("(1, 2]"), parse_answer("[1, 2]"))
    assert objects_equal(sympy.FiniteSet(1, 2), sympy.FiniteSet(2, 1))
    assert objects_equal(parse_answer("x \\leq 3"), parse_answer("3 \\geq x"))


def test_clean_answer_normalisations():
    assert clean_answer("\\$1,\\!234.50") == "1234.50"
    assert clean_answer("90^{\\circ}") == "90"
    assert clean_answer("\\dfrac12") == "\\frac{1}{2}"
    assert clean_answer("x = \\sqrt3") == "\\sqrt{3}"
    assert clean_answer("4.5e33") == "4.5\\times 10^{33}"
    assert clean_answer("15 \\text{ cm}^2") == "15"
    assert clean_answer("np.arcsin(10/13)") == "\\arcsin(10/13)"
