"""input_guard: each limit rejects what it names, ordinary answers (every benchmark ground truth) pass."""

import os

import pytest

from deepscaler.rewards.math_utils.input_guard import (
    GuardLimits,
    check_expression,
    check_text,
    limits_scope,
    active_limits,
    rejections,
)
from deepscaler.rewards.math_utils.safe_parse import parse_answer


@pytest.mark.parametrize(
    "text, reason",
    [
        ("1" * 401, "digits"),
        ("(" * 9 + "1" + ")" * 9, "'(' nested deeper"),
        ("[" * 9 + "1" + "]" * 9, "'[' nested deeper"),
        ("{" * 9 + "1" + "}" * 9, "'{' nested deeper"),
        ("\\{" * 9 + "1" + "\\}" * 9, "'\\{' nested deeper"),
        ("\\left(" * 9 + "1" + "\\right)" * 9, "'\\left' nested deeper"),
        ("(1+[2+{3+" * 5 + "1" + "}])" * 5, "brackets nested deeper than 12"),
        ("\\frac{1}{" * 7 + "2" + "}" * 7, "fractions nested"),
        ("\\sqrt{" * 7 + "2" + "}" * 7, "roots nested"),
        ("9^{9^{9^{9}}}", "exponent tower"),
        ("2^2^2^2", "exponent tower"),
        ("2**2**2**2", "exponent tower"),
        ("10000000!", "factorial"),
        ("x+" * 700 + "x", "tokens"),
        ("1" * 2001, "longer than"),
        ("９" * 401, "digits"),  # full-width digits are digits too
        ("٩" * 401, "digits"),  # Arabic-Indic
    ],
)
def test_each_limit_rejects_what_it_names(text, reason):
    found = check_expression(text)
    assert found is not None and reason in found


@pytest.mark.parametrize(
    "text",
    [
        "\\frac{\\sqrt{3}}{2}",
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        "2^{1009}",
        "e^{-x^2}",
        "2^{2^{2}}",
        "\\frac{100!}{2^{50}}",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\{1, 2, 3\\}",
        "x^2 + 3x - 4 = 0",
        "\\frac{1}{1+\\frac{1}{1+\\frac{1}{2}}}",
        "2^3 + 4^5 + 6^7",
        "(a+b)(c+d)",
    ],
)
def test_ordinary_answers_pass(text):
    assert check_expression(text) is None


def test_every_benchmark_ground_truth_passes_the_guard(repo_data_dir):
    import pandas as pd

    gts = set()
    for name in ("valid.all.parquet", "valid.arc_c.parquet", "valid.gpqa.parquet"):
        frame = pd.read_parquet(os.path.join(repo_data_dir, "benchmarks", name))
        gts |= {str(r["ground_truth"]) for r in frame["reward_model"]}
    rejected = {gt: check_expression(gt) for gt in gts if check_expression(gt) is not None}
    assert len(gts) > 1000 and rejected == {}


def test_limits_are_configurable_per_thread_and_validated():
    assert check_expression("(" * 9 + "1" + ")" * 9) is not None
    with limits_scope(GuardLimits(max_depth_per_kind=10)):
        assert active_limits().max_depth_per_kind == 10
        assert check_expression("(" * 9 + "1" + ")" * 9) is None
    assert active_limits() == GuardLimits()
    with pytest.raises(ValueError, match="max_depth"):
        GuardLimits(max_depth=0)


def test_many_boxes_in_a_response_are_refused():
    assert check_text("\\boxed{1}" * 65) is not None
    assert check_text("\\boxed{1}" * 3) is None


def test_rule_parser_records_guard_rejections_and_tree_limits():
    before = rejections()[0]
    assert parse_answer("9^{9^{9^{9}}}") is None  # string guard
    assert parse_answer("9^{9^{9}}") is None  # tree guard: 9^387420489 is never computed
    assert parse_answer("(a+b+c+d+e)^{20}") is None  # 10,626 terms once expanded
    assert parse_answer("\\int e^{x^2} dx") is None
    assert rejections()[0] - before == 4
    assert parse_answer("(x+1)^{3}") is not None
