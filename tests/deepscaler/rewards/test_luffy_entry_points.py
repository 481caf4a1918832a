"""LUFFY's deepscaler entry points as thin aliases: deepscaler_reward_fn and RewardMathFn/RewardConfig,
with LUFFY's semantics pinned on hand-made cases."""

from types import SimpleNamespace

import pytest

from deepscaler.rewards import RewardConfig, RewardInput, RewardOutput, RewardType
from deepscaler.rewards.math_reward import RewardMathFn, deepscaler_reward_fn

POLY = "<think> I am omniscient. </think> The answer is \\boxed{24 + 14*x + (-13)*x^2 - 2*x^3 + x^4}."


def _math(response, answer, problem="p"):
    return RewardInput(
        problem=problem, model_response=response, problem_type=RewardType.MATH, ground_truth={"answer": answer}
    )


def test_deepscaler_reward_fn_luffys_example_and_its_rules():
    # LUFFY's own example: any ground truth of the list may match
    assert deepscaler_reward_fn(POLY, ["10", "$x^{4}-2 x^{3}-13 x^{2}+14 x+24$"]) is True
    assert deepscaler_reward_fn("<think>a</think> \\boxed{7}", "7") is True
    assert deepscaler_reward_fn("<think>a</think> \\boxed{7}", "\\boxed{7}") is True  # boxed ground truth
    assert deepscaler_reward_fn("<think>a</think> \\boxed{8}", "7") is False
    assert deepscaler_reward_fn("a</think> \\boxed{7}", "7") is False  # <think> is required too
    assert deepscaler_reward_fn("<think>a \\boxed{7}", "7") is False  # no </think>
    assert deepscaler_reward_fn("<think>a</think> 7", "7") is False  # nothing boxed


def test_reward_math_fn_gives_luffys_reward_constants():
    fn = RewardMathFn(RewardConfig())
    assert fn(_math("<think>a</think> \\boxed{7}", "7")) == RewardOutput(1.0, True)
    assert fn(_math("<think>a</think> \\boxed{8}", "7")) == RewardOutput(-1.0, False)
    assert fn(_math("no tags \\boxed{7}", "7")) == RewardOutput(-1.0, False)
    assert fn(_math("<think>a</think> \\boxed{7}", None)) == RewardOutput(-1.0, False)
    custom = RewardMathFn(RewardConfig(incorrect_reward=0.0, format_error_reward=-0.5))
    assert custom(_math("<think>a</think> \\boxed{8}", "7")).reward == 0.0
    assert custom(_math("\\boxed{7}", "7")).reward == -0.5
    with pytest.raises(ValueError, match="MATH"):
        fn(RewardInput(problem="p", model_response="x", problem_type=RewardType.CODE))


def test_use_math_orm_asks_the_judge_about_answers_the_rules_call_wrong():
    with pytest.raises(ValueError, match="needs a judge"):
        deepscaler_reward_fn("<think>a</think> \\boxed{8}", "7", enable_llm=True)
    asked = []

    class Judge:
        def judge(self, problem, reference, response):
            asked.append((problem, reference, response))
            return SimpleNamespace(verdict=response == "seven")

    assert deepscaler_reward_fn("<think>a</think> \\boxed{seven}", "7", enable_llm=True, judge=Judge()) is True
    assert deepscaler_reward_fn("<think>a</think> \\boxed{8}", "7", enable_llm=True, judge=Judge()) is False
    assert asked[0][1:] == ("7", "seven")
    assert deepscaler_reward_fn("<think>a</think> \\boxed{7}", "7", enable_llm=True, judge=Judge()) is True
    assert len(asked) == 2  # a rule-correct answer never reaches the judge
