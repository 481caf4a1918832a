"""Small value types shared by the scorers, the process pool and the reward manager.

``ScoreResult`` is what every internal scorer returns (the verl-style ``compute_score`` keeps only its
``score``); ``RewardValues`` holds the reward a scorer gives for each outcome (LUFFY's version 1 gives
-0.5 for a wrong answer and -1 for a format error, every other version 1/0).
"""
from __future__ import annotations

import dataclasses
import enum


@dataclasses.dataclass(frozen=True)
class RewardValues:
    correct: float = 1.0
    incorrect: float = 0.0
    format_error: float = 0.0
    unknown_error: float = 0.0


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    """Outcome of grading one response.

    Attributes:
        score: the reward value for this outcome.
        correct: whether the answer was judged equal to the ground truth.
        parse_failed: no answer could be taken from the response (missing ``</think>`` where required,
            nothing boxed / extractable, or an unusable ground truth); counted as
            ``reward/parse_fail_count``.
        answer: the extracted answer (at most 2,000 characters) when the scorer extracts one; the
            LLM judge uses it, and it helps debugging.
    """

    score: float
    correct: bool
    parse_failed: bool = False
    answer: str | None = None


# ---------------------------------------------------------------------------------------------------------------
# LUFFY's (deepscaler's) class API, kept under its names for scripts that import it; the graders behind it are
# the functions above (math_reward.RewardMathFn, verl.mix_src.math_verify_reward.RewardMathFn).
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
