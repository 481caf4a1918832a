"""LUFFY's (deepscaler's) reward class API under its names, for scripts that import it:
``RewardConfig``, ``RewardType``, ``RewardInput``, ``RewardOutput`` and the ``RewardFn`` base (exported from
``deepscaler.rewards`` as in LUFFY). The graders behind it are this package's functions:
``math_reward.RewardMathFn`` and ``verl.mix_src.math_verify_reward.RewardMathFn``.
"""

from __future__ import annotations

import dataclasses
import enum


@dataclasses.dataclass
class RewardConfig:
    """LUFFY's reward constants: a wrong answer, a format error and a missing ground truth all give -1."""

    use_math_orm: bool = False  # ask an LLM judge when the rule grader says wrong (needs a judge object)
    correct_reward: float = 1.0
    incorrect_reward: float = -1.0
    format_error_reward: float = -1.0
    unk_error_reward: float = -1.0
    think_format: bool = True  # math-verify variant: grade only the text after </think> (both tags required)


class RewardType(enum.Enum):
    MATH = "MATH"
    CODE = "CODE"
    UNK = "UNK"


@dataclasses.dataclass
class RewardInput:
    """``ground_truth`` is ``{"answer": str | list[str]}`` for math."""

    problem: str
    model_response: str
    problem_type: RewardType = RewardType.UNK
    ground_truth: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RewardOutput:
    reward: float
    is_correct: bool


class RewardFn:
    """Base of LUFFY's reward classes: ``RewardFn(config)(RewardInput) -> RewardOutput``."""

    def __init__(self, config: RewardConfig):
        self.config = config

    def __call__(self, input: RewardInput) -> RewardOutput:  # noqa: A002 (LUFFY's parameter name)
        raise TypeError(f"{type(self).__name__} must define __call__")
