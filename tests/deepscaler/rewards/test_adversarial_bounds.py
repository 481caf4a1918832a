"""Every public grading entry point returns within its bound for adversarial model output, in a worker thread.

Each case runs from a ``threading.Thread`` (where math-verify's own SIGALRM timers cannot work) and the
test measures wall time. The default budget is ``GuardLimits().time_budget_s`` (3 s); the guards keep
every case here far below it (worst measured ~0.8 s on a loaded 2-core box), BOUND_S leaves room for
a busy CI machine. Before the guards, the first three cases did not return within 60 s / took 51 s.
"""

import threading
import time

import pytest

from deepscaler.rewards import compute_score, grade, grade_solution, score_response
from deepscaler.rewards.math_reward import deepscaler_score
from deepscaler.rewards.math_utils.input_guard import GuardLimits
from deepscaler.rewards.math_verify_reward import math_verify_score

BOUND_S = 5.0
assert GuardLimits().time_budget_s < BOUND_S


def nest(open_, close, n, mid="1"):
    return open_ * n + mid + close * n


CASES = {
    # the three
    "tower_9": "\\boxed{9^{9^{9^{9^{9}}}}}",
    "paren_5000": "\\boxed{" + nest("(", ")", 5000) + "}",
    "frac_2000": "\\boxed{" + nest("\\frac{1}{", "}", 2000, "2") + "}",
    # huge exponents and towers
    "pow_2_2_30": "The answer is 2^(2^30).",
    "pow_plain_10_10_10": "so the answer is 10**10**10",
    "tower_dollar": "$10^{10^{10}}$",
    "exp_tower": "\\boxed{\\exp(\\exp(\\exp(100)))}",
    "e_tower": "\\boxed{e^{e^{e^{e^{10}}}}}",
    "x_99999999": "\\boxed{x^{99999999}}",
    "x1_99999999": "\\boxed{(x+1)^{99999999}}",
    "multinomial": "\\boxed{(a+b+c+d+e)^{20}}",
    "pow_mod": "\\boxed{2^{10^{8}} \\mod 7}",
    "float_pow": "\\boxed{1.0000001^{10^{9}}}",
    # factorials and friends
    "fact_1e7": "\\boxed{10000000!}",
    "fact_pow": "\\boxed{(10^7)!}",
    "fact_nested": "\\boxed{(((3!)!)!)!}",
    "binom": "\\boxed{\\binom{10^{9}}{5 \\cdot 10^{8}}}",
    "gamma": "\\boxed{\\Gamma(10^{8})}",
    "prod": "\\boxed{\\prod_{i=1}^{10^{7}} i}",
    "sum": "\\boxed{\\sum_{i=1}^{10^{9}} i^i}",
    "integral": "\\boxed{\\int e^{x^2}\\sin(x^3) dx}",
    # deep nesting of every bracket kind and of \frac / \sqrt
    "bracket": "\\boxed{" + nest("[", "]", 5000) + "}",
    "brace": "\\boxed{" + nest("{", "}", 5000) + "}",
    "set_brace": "\\boxed{" + nest("\\{", "\\}", 5000) + "}",
    "left_right": "\\boxed{" + nest("\\left(", "\\right)", 5000) + "}",
    "sqrt": "\\boxed{" + nest("\\sqrt{", "}", 2000, "2") + "}",
    "pow_nest": "\\boxed{" + nest("2^{", "}", 2000) + "}",
    "abs": "\\boxed{" + nest("|", "|", 2000) + "}",
    "angle": "\\boxed{" + nest("\\langle ", "\\rangle ", 2000) + "}",
    "paren_plain": "The answer is " + nest("(", ")", 5000),
    "mixed_at_limit": "\\boxed{" + "(1+[2+\\{3+" * 4 + "1" + "\\}]) " * 4 + "}",
    # long sums and literals
    "sum_1e5": "\\boxed{" + "1+" * 100000 + "1}",
    "sum_plain_1e5": "The answer is " + "1+" * 100000 + "1",
    "digits_1e6": "\\boxed{" + "9" * 10**6 + "}",
    "digits_plain": "answer: " + "9" * 10**6,
    "many_fracs": "\\boxed{" + "+".join("\\frac{%d}{%d}" % (i, i + 1) for i in range(1, 400)) + "}",
    "simplify_heavy": "\\boxed{\\frac{(a+b+c)^{12}-(a-b-c)^{12}}{(a+b)^{5}(b+c)^{5}}}",
    # pathological unicode
    "fullwidth_digits": "\\boxed{" + "９" * 5000 + "}",
    "arabic_digits": "\\boxed{" + "٩" * 5000 + "}",
    "math_digits": "\\boxed{" + "𝟗" * 5000 + "}",
    "superscripts": "\\boxed{2⁹⁹⁹⁹⁹⁹⁹⁹}",
    "combining": "\\boxed{1" + "\u0301" * 100000 + "}",
    "zero_width": "\\boxed{" + "1\u200b" * 50000 + "}",
    "rtl_override": "\\boxed{\u202e" + "1+" * 1000 + "1}",
    "lone_surrogates": "\\boxed{\ud800" * 1000 + "}",
    # many boxes and candidates
    "boxed_1e5": "\\boxed{1}" * 100000,
    "boxed_unclosed_1e5": "\\boxed{" * 100000,
    "boxed_bad_1e4": "\\boxed{(((}" * 10000,
    "failing_dollars": "$\\frac{$ " * 20000,
    "display_math_open": "\\[" * 50000,
    # 10 MB strings
    "10mb_letters": "a" * 10**7,
    "10mb_digits": "9" * 10**7,
    "10mb_braces": "{" * 10**7,
    "10mb_sum": "1+" * 5 * 10**6,
    "10mb_then_box": "x" * 10**7 + "\\boxed{3}",
    "think_tags_1e5": "</think>" * 100000 + "\\boxed{3}",
}

ENTRY_POINTS = {
    "compute_score_v3": lambda t: compute_score("math", "<think>\nx\n</think>\n" + t, "2", reward_impl_version=3),
    "compute_score_v4_any": lambda t: compute_score("aime", t, "2", reward_impl_version=4, grader="any"),
    "compute_score_v1_rule": lambda t: compute_score("aime", "<think>\nx\n</think>\n" + t, "2", reward_impl_version=1),
    "score_response_MATH": lambda t: score_response("lighteval/MATH", t, "2").score,
    "grade_any": lambda t: grade(t, "2", grader="any"),
    "grade_as_ground_truth": lambda t: grade("\\boxed{2}", t[:200_000], grader="any"),
}


def _timed_in_thread(fn):
    box = {}

    def target():
        # The graders' budget is the grading thread's CPU time, so that is what is bounded here: wall
        # time on a shared machine depends on the neighbours (the join below is the wall backstop).
        start = time.thread_time()
        box["value"] = fn()
        box["elapsed"] = time.thread_time() - start

    thread = threading.Thread(target=target, name="reward-thread")
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "grader still running after 120 s"
    return box["value"], box["elapsed"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_entry_point_returns_within_the_bound_from_a_worker_thread(case):
    text = CASES[case]
    for name, entry in ENTRY_POINTS.items():
        value, elapsed = _timed_in_thread(lambda: entry(text))
        assert elapsed < BOUND_S, f"{name} took {elapsed:.2f} s on {case}"
        assert value in (0.0, -0.5, -1.0, False, 1.0, True)


@pytest.mark.parametrize("case", ["tower_9", "paren_5000", "frac_2000", "fact_pow", "multinomial", "integral"])
def test_beyond_the_limits_is_unparseable_scored_zero_and_flagged(case):
    text = "<think>\nx\n</think>\n" + CASES[case]
    for version in (0, 3):
        result, elapsed = _timed_in_thread(lambda: score_response("math", text, "2", reward_impl_version=version))
        assert elapsed < BOUND_S
        assert (result.score, result.correct, result.parse_failed, result.unparseable, result.timed_out) == (
            0.0,
            False,
            True,
            True,
            False,
        ), (version, result)


def test_underlying_scorers_used_by_the_luffy_aliases_are_bounded_too():
    text = "<think>\nx\n</think>\n" + CASES["tower_9"]
    for fn in (
        lambda: deepscaler_score(text, "2"),
        lambda: math_verify_score(text, "2"),
        lambda: grade_solution(CASES["paren_5000"], "2", "any"),
    ):
        result, elapsed = _timed_in_thread(fn)
        assert elapsed < BOUND_S and not result.correct and result.unparseable


def test_a_spent_budget_is_a_timeout_not_a_wrong_answer():
    tiny = GuardLimits(time_budget_s=1e-6)
    text = "<think>\nx\n</think>\nThe answer is \\boxed{2}."
    result, elapsed = _timed_in_thread(lambda: score_response("math", text, "2", limits=tiny))
    assert (result.score, result.correct, result.timed_out) == (0.0, False, True) and elapsed < BOUND_S
    assert score_response("math", text, "2").correct  # the same item with the default budget


def test_ordinary_answers_still_grade_correctly_under_the_guards():
    cases = [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{2^{10}}", "1024"),
        ("\\boxed{(x+1)^{2}}", "x^2+2x+1"),
        ("\\boxed{\\frac{100!}{2^{50}}}", "\\frac{100!}{2^{50}}"),
        ("\\boxed{e^{-x^2}}", "e^{-x^2}"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ]
    for text, gt in cases:
        for grader in ("math_verify", "rule"):
            assert grade(text, gt, grader=grader), (text, gt, grader)


def test_a_box_before_a_long_tail_is_still_found():
    text = "The answer is \\boxed{17}.\n" + "Let me double check. " * 2000
    assert grade(text, "17", grader="math_verify")
    assert compute_score("math", "<think>\nx\n</think>\n" + text, "17") == 1.0


def test_concurrent_threads_grade_correctly_next_to_adversarial_and_timed_out_items():
    from concurrent.futures import ThreadPoolExecutor

    tight = GuardLimits(time_budget_s=0.05)
    slow_but_allowed = "\\boxed{(99+\\frac{10 y}{(y+a)^{5}})^{30}}"  # SymPy work the watchdog has to cut

    def job(k):
        kind = k % 4
        start = time.perf_counter()
        if kind == 0:
            value = grade("\\boxed{\\frac{1}{2}}", "0.5", grader="any")
            expected = True
        elif kind == 1:
            value = grade(CASES["tower_9"], "2", grader="any")
            expected = False
        elif kind == 2:
            value = grade_solution(slow_but_allowed, "\\tan(\\tan(99))", "any", limits=tight).timed_out
            expected = True  # takes seconds of SymPy work: cut at the 0.05 s budget
        else:
            value = compute_score("math", "<think>\nx\n</think>\n\\boxed{(x+1)^{2}}", "x^2+2x+1")
            expected = 1.0
        return value == expected, time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(job, range(24)))
    assert all(ok for ok, _ in outcomes)
    assert max(elapsed for _, elapsed in outcomes) < BOUND_S
    # Nothing left behind: a late watchdog exception or SymPy switched to evaluate=False would show here.
    time.sleep(0.1)
    assert grade("\\boxed{2+2}", "4", grader="any") and compute_score("math", "<think>\n</think>\\boxed{4}", "4") == 1.0
