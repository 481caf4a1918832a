"""LUFFY's module path ``verl.mix_src.math_verify_reward``, kept as thin aliases of the math-verify grader
(``deepscaler.rewards.math_verify_reward``): ``reward_fn_math_verify`` grades the text after the first
``</think>`` (both think tags required) and ``reward_fn_math_verify_no_think`` the whole response, each
returning whether math-verify finds the answer equal to ``"$" + ground_truth + "$"``."""

from __future__ import annotations

from typing import List, Union

from deepscaler.rewards.math_utils.extract import THINK_CLOSE, THINK_OPEN
from deepscaler.rewards.math_verify_reward import math_verify_score
from deepscaler.rewards.luffy_reward_types import RewardConfig, RewardFn, RewardInput, RewardOutput, RewardType

__all__ = ["RewardMathFn", "labeling_responses", "reward_fn_math_verify", "reward_fn_math_verify_no_think"]


class RewardMathFn(RewardFn):
    """LUFFY's math-verify ``RewardMathFn``: ``config.think_format`` requires both think tags (missing: format
    error) and grades the section after the first ``</think>``; otherwise the whole response. Correct /
    incorrect rewards come from ``RewardConfig``."""

    def __call__(self, input: RewardInput) -> RewardOutput:  # noqa: A002 (LUFFY's parameter name)
        if input.problem_type != RewardType.MATH:
            raise ValueError(f"RewardMathFn grades MATH problems, got problem_type={input.problem_type}")
        cfg, text = self.config, input.model_response
        if cfg.think_format and (THINK_OPEN not in text or THINK_CLOSE not in text):
            return RewardOutput(cfg.format_error_reward, False)
        result = math_verify_score(text, (input.ground_truth or {}).get("answer"), require_think=cfg.think_format)
        return RewardOutput(cfg.correct_reward if result.correct else cfg.incorrect_reward, result.correct)


def _grade(solution_str: str, ground_truth, think_format: bool) -> bool:
    fn = RewardMathFn(RewardConfig(think_format=think_format))
    return fn(
        RewardInput(
            problem=solution_str,
            problem_type=RewardType.MATH,
            model_response=solution_str,
            ground_truth={"answer": ground_truth},
        )
    ).is_correct


def reward_fn_math_verify(solution_str: str, ground_truth: Union[str, List[str]], enable_llm: bool = False) -> bool:
    """Math-verify on the text after ``</think>``. ``enable_llm`` is accepted for LUFFY's signature; LUFFY's
    math-verify grader never calls a judge either."""
    return _grade(solution_str, ground_truth, think_format=True)


def reward_fn_math_verify_no_think(
    solution_str: str, ground_truth: Union[str, List[str]], enable_llm: bool = False
) -> bool:
    """Math-verify on the whole response."""
    return _grade(solution_str, ground_truth, think_format=False)


def labeling_responses(responses: list[str], golden_answer: str) -> list[bool]:
    """LUFFY's eval labels: math-verify of each response text against ``"$" + golden_answer + "$"`` (the
    default grader of eval_scripts/generate_vllm.py; bounded, see ``grade_solution``)."""
    from deepscaler.rewards.math_verify_reward import grade_solution

    return [bool(grade_solution(r, golden_answer, "math_verify").correct) for r in responses]
