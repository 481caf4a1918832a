"""Model output never executes and pathological answers are cut short by the parser's guards."""

import ast
import pathlib
import time

import pytest

from deepscaler.rewards import compute_score, grade
from deepscaler.rewards.math_utils import parse_answer

REPO = pathlib.Path(__file__).resolve().parents[3]


def _payloads(marker: pathlib.Path) -> list[str]:
    cmd = f"touch {marker}"
    return [
        f"__import__('os').system('{cmd}')",
        f"eval(\"__import__('os').system('{cmd}')\")",
        f"exec(\"import os; os.system('{cmd}')\")",
        "().__class__.__bases__[0].__subclasses__()",
        f"\\text{{__import__('os').system('{cmd}')}}",
        f"x + __import__(\"subprocess\").call(['touch', '{marker}'])",
    ]


def test_python_code_in_a_boxed_answer_executes_nothing(tmp_path):
    marker = tmp_path / "pwned"
    for payload in _payloads(marker):
        boxed = f"<think>\nhmm\n</think>\nThe answer is $\\boxed{{{payload}}}$. The answer is {payload}"
        for version in range(5):
            assert compute_score("math", boxed, "1", reward_impl_version=version) <= 0.0
        for grader in ("rule", "math_verify", "any"):
            assert grade(boxed, "1", grader=grader) is False
            # The payload as the *ground truth* must not run either.
            assert grade("\\boxed{1}", payload, grader=grader) is False
    assert not marker.exists()


def _forbidden_calls(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id in {"eval", "exec", "compile", "sympify", "parse_expr", "S"}:
                bad.append(f"{path.name}:{node.lineno} {fn.id}()")
            if isinstance(fn, ast.Attribute) and fn.attr in {"sympify", "parse_expr", "lambdify", "S"}:
                bad.append(f"{path.name}:{node.lineno} .{fn.attr}()")
    return bad


def test_reward_code_contains_no_eval_exec_sympify_or_parse_expr_calls():
    files = list((REPO / "deepscaler").rglob("*.py")) + list((REPO / "verl/workers/reward_manager").rglob("*.py"))
    assert files
    assert [b for f in files for b in _forbidden_calls(f)] == []


@pytest.mark.parametrize(
    "answer",
    [
        "9^{9^{9^{9}}}",
        "10^{10^{10}}",
        "2^{2^{2^{2^{2^{2}}}}}",
        "(10^{10})!",
        "100000000!",
        "x^{1000000}",
        "(x+1)^{100000}",
        "{" * 300 + "1" + "}" * 300,
        "(" * 300 + "1" + ")" * 300,
        "1+" * 5000 + "1",
    ],
)
def test_pathological_answers_finish_fast_and_score_zero_with_the_rule_grader(answer):
    start = time.perf_counter()
    assert grade(f"\\boxed{{{answer}}}", "2", grader="rule") is False
    assert time.perf_counter() - start < 10.0


def test_guard_rejects_huge_results_but_keeps_moderate_ones():
    assert parse_answer("9^{9^{9}}") is None
    assert parse_answer("2^{1009}") is not None
    assert parse_answer("\\frac{100!}{2^{50}}") is not None
    assert parse_answer("(" * 40 + "1" + ")" * 40) is None


# ---------------------------------------------------------------------- NaN/inf references
@pytest.mark.parametrize("gt", [float("nan"), "nan", "inf", "-inf", ["nan"]])
@pytest.mark.parametrize("version", [0, 1, 3, 4])
def test_nan_or_inf_ground_truth_is_never_graded_correct(gt, version):
    from deepscaler.rewards.selection import fail_success_values, grade, score_response

    text = (
        "<think>\nx\n</think>\nThe answer is \\boxed{nan}."
        if version == 4
        else "x\n</think>\nThe answer is \\boxed{nan}."
    )
    for answer in ("nan", "inf", "-inf"):
        result = score_response("aime", text.replace("nan", answer), gt, reward_impl_version=version, grader="any")
        assert not result.correct and result.score == fail_success_values(version)[0]
        assert grade(f"\\boxed{{{answer}}}", gt, grader="any") is False
