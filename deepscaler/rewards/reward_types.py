"""Small value types shared by the scorers, the process pool and the reward manager.

``ScoreResult`` is what every internal scorer returns (the verl-style ``compute_score`` keeps only its
``score``); ``RewardValues`` holds the reward a scorer gives for each outcome (LUFFY's version 1 gives
-0.5 for a wrong answer and -1 for a format error, every other version 1/0).
"""

from __future__ import annotations

import dataclasses


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
        unparseable: an input guard refused part of the response or ground truth (beyond a size,
            nesting or magnitude limit, never evaluated) and the answer was not graded correct; such
            results also have ``parse_failed``. Counted as ``reward/unparseable_count``.
        timed_out: grading ran past its time budget (``GuardLimits.time_budget_s``) or the scoring
            pool's per-item timeout, both counted in CPU time; scored 0. Counted as
            ``reward/timeout_count``.
        wall_timed_out: the call was ended by the wall-clock backstop (it waited far longer than its
            CPU budget without spending it); also ``timed_out``. Counted as ``reward/wall_timeout_count``.
    """

    score: float
    correct: bool
    parse_failed: bool = False
    answer: str | None = None
    unparseable: bool = False
    timed_out: bool = False
    wall_timed_out: bool = False


# LUFFY's deepscaler/rewards/reward_types.py names (its class API), defined in luffy_reward_types.
from deepscaler.rewards.luffy_reward_types import (  # noqa: E402,F401
    RewardConfig,
    RewardFn,
    RewardInput,
    RewardOutput,
    RewardType,
)
