"""LUFFY's ``verl.mix_src.reward_with_format`` under its names, on this package's bounded graders.

``deepscaler_reward_fn_impl1`` is reward version 1 (1 / -0.5 / -1); ``math_verify_reward_fn`` is math-verify
accuracy times the ``^<think>\\n.*?\\n</think>`` format check; ``accuracy_reward`` / ``format_reward`` are the
two factors over lists, as in LUFFY (TRL's reward-function shape).
"""

from __future__ import annotations

import re
from typing import List, Sequence, Union

from deepscaler.rewards.math_reward import IMPL1_VALUES, deepscaler_score
from deepscaler.rewards.math_verify_reward import grade_solution

__all__ = ["accuracy_reward", "deepscaler_reward_fn_impl1", "format_reward", "math_verify_reward_fn"]

# LUFFY's format rule: the completion starts with a think block (anchored, so one linear scan).
_THINK_PREFIX = re.compile(r"<think>\n.*?\n</think>", re.DOTALL)


def deepscaler_reward_fn_impl1(
    solution_str: str, ground_truth: Union[str, List[str]], enable_llm: bool = False
) -> float:
    """Reward version 1 of a full response: 1 right, -0.5 wrong, -1 format error / no ground truth."""
    if enable_llm:
        raise ValueError("enable_llm=True needs a judge: configure reward.orm.* (the trainer's LLM judge)")
    return float(deepscaler_score(solution_str, ground_truth, IMPL1_VALUES).score)


def accuracy_reward(completions: Sequence[str], solution: Sequence[str], **kwargs) -> list[float]:
    """1.0 where math-verify finds the completion's answer equal to the solution, else 0.0."""
    return [float(grade_solution(c, s, "math_verify").correct) for c, s in zip(completions, solution)]


def format_reward(completions: Sequence[str], **kwargs) -> list[float]:
    """1.0 where the completion opens with a ``<think>\\n ... \\n</think>`` block, else 0.0."""
    return [1.0 if _THINK_PREFIX.match(c) else 0.0 for c in completions]


def math_verify_reward_fn(solution_str: str, ground_truth: str, enable_llm: bool = False) -> float:
    """Accuracy x format of one response (LUFFY: a string ground truth only)."""
    if not isinstance(ground_truth, str):
        raise TypeError(f"ground_truth must be a string, got {type(ground_truth).__name__}")
    return accuracy_reward([solution_str], [ground_truth])[0] * format_reward([solution_str])[0]
