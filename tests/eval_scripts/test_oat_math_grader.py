"""eval_scripts/oat_math_grader.py: OAT's boxed_reward_fn contract on hand-made cases."""

from eval_scripts.oat_math_grader import boxed_reward_fn, extract_answer, grade


def test_boxed_reward_fn_returns_formatted_and_reward():
    assert boxed_reward_fn("so \\boxed{\\frac{1}{2}}", "0.5") == ({"formatted": True}, 1.0)
    assert boxed_reward_fn("so \\boxed{3}", "4") == ({"formatted": True}, 0.0)
    assert boxed_reward_fn("the answer is 4", "4") == ({"formatted": False}, 0.0)  # nothing boxed
    assert boxed_reward_fn("\\boxed{1} then \\boxed{4}", "4")[1] == 1.0  # the last box
    assert boxed_reward_fn("\\boxed{4}", ["5", "4"])[1] == 1.0  # any ground truth
    assert boxed_reward_fn("\\boxed{4}", 4)[1] == 1.0 and boxed_reward_fn("\\boxed{4}", "\\boxed{4}")[1] == 1.0


def test_fast_skips_math_verify():
    # LUFFY's extraction: only ``\\boxed{...}`` counts (an \\fbox alone is no answer, as in OAT's file).
    assert extract_answer("\\fbox{7}") is None and extract_answer("7") is None
    assert extract_answer("\\boxed{1} and \\boxed{7}") == "7"
    assert grade("x^2+1", "1+x^{2}")
    assert not grade("2", "3", fast=False)
