"""LUFFY's module path verl.mix_src.math_verify_reward: reward_fn_math_verify(_no_think) and its RewardMathFn."""

from deepscaler.rewards import RewardConfig, RewardInput, RewardOutput, RewardType
from verl.mix_src import math_verify_reward as mv


def _math(response, answer):
    return RewardInput(
        problem="p", model_response=response, problem_type=RewardType.MATH, ground_truth={"answer": answer}
    )


def test_reward_fn_math_verify_grades_after_think():
    assert mv.reward_fn_math_verify("<think>x</think> so \\boxed{57}", "57") is True
    assert mv.reward_fn_math_verify("<think>x</think> so \\boxed{\\frac{1}{2}}", "0.5") is True
    assert mv.reward_fn_math_verify("so \\boxed{57}", "57") is False  # tags required
    # LUFFY's split('</think>')[1]: text after a second </think> is not graded
    assert mv.reward_fn_math_verify("<think>x</think> \\boxed{3} </think> \\boxed{57}", "57") is False
    assert mv.reward_fn_math_verify_no_think("so \\boxed{57}", "57") is True
    fn = mv.RewardMathFn(RewardConfig())
    assert fn(_math("<think>x</think> \\boxed{56}", "57")) == RewardOutput(-1.0, False)
    assert fn(_math("\\boxed{57}", "57")) == RewardOutput(-1.0, False)
