"""Reward selection by ``data_source`` and ``data.reward_impl_version`` (docs/METHOD.md §4.1).

``select_score_fn`` mirrors LUFFY's ``_select_rm_score_fn``: ``openai/gsm8k`` and ``lighteval/MATH``
get verl's scorers, every other source (``synthetic_arith``, ``aime``, ``arc_c`` ...) the function of
the configured version. The returned callable takes the *raw decoded response* and applies the
version's input rule itself (``"<think>\\n"`` prepended for every version except 4).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from deepscaler.rewards.bounded import bounded, set_warm_routine, warm_graders
from deepscaler.rewards.gsm8k_warning import warn_gsm8k_boxed
from deepscaler.rewards.math_utils.input_guard import GuardLimits
from deepscaler.rewards.math_reward import IMPL1_VALUES, BINARY_VALUES, deepscaler_score, deepscaler_score_nothink
from deepscaler.rewards.math_verify_reward import GRADERS, grade_solution, math_verify_score
from deepscaler.rewards.math_utils import split_after_think
from deepscaler.rewards.reward_types import ScoreResult
from deepscaler.rewards.verl_scorers import gsm8k_score, math_dataset_score
from deepscaler.rewards.finite import is_non_finite

REWARD_IMPL_VERSIONS = (0, 1, 2, 3, 4)
THINK_PREFIX = "<think>\n"
GSM8K_SOURCE = "openai/gsm8k"
MATH_SOURCE = "lighteval/MATH"

ScoreFn = Callable[[str, object], ScoreResult]


def check_version(reward_impl_version: int) -> int:
    if reward_impl_version not in REWARD_IMPL_VERSIONS:
        raise ValueError(f"data.reward_impl_version must be one of {REWARD_IMPL_VERSIONS}, got {reward_impl_version!r}")
    return int(reward_impl_version)


def fail_success_values(reward_impl_version: int) -> tuple[float, float]:
    """(fail, success) scores used by the trainer's group statistics (docs/METHOD.md §1.5)."""
    check_version(reward_impl_version)
    return (IMPL1_VALUES.incorrect, IMPL1_VALUES.correct) if reward_impl_version == 1 else (0.0, 1.0)


def select_score_fn(data_source: str, reward_impl_version: int = 3, grader: str = "math_verify") -> ScoreFn:
    """Score function ``fn(raw_response, ground_truth) -> ScoreResult`` for one row.

    ``grader`` only changes versions 3 and 4 (LUFFY's math-verify scorers): ``rule`` or ``any`` swap the
    equivalence check while keeping the version's think handling. Versions 0-2 are the deepscaler rule
    grader by definition; the two named data sources use verl's scorers.
    """
    check_version(reward_impl_version)
    if grader not in GRADERS:
        raise ValueError(f"reward.grader must be one of {GRADERS}, got {grader!r}")
    if data_source == GSM8K_SOURCE:
        return lambda response, gt: gsm8k_score(_with_think_prefix(response, reward_impl_version), gt)
    if data_source == MATH_SOURCE:
        return lambda response, gt: math_dataset_score(_with_think_prefix(response, reward_impl_version), gt)
    if reward_impl_version == 0:
        return lambda response, gt: deepscaler_score(THINK_PREFIX + response, gt, BINARY_VALUES)
    if reward_impl_version == 1:
        return lambda response, gt: deepscaler_score(THINK_PREFIX + response, gt, IMPL1_VALUES)
    if reward_impl_version == 2:
        return lambda response, gt: deepscaler_score_nothink(THINK_PREFIX + response, gt)
    if reward_impl_version == 3:
        return lambda response, gt: math_verify_score(THINK_PREFIX + response, gt, True, grader)
    return lambda response, gt: math_verify_score(response, gt, False, grader)


def _with_think_prefix(response: str, reward_impl_version: int) -> str:
    return response if reward_impl_version == 4 else THINK_PREFIX + response


def graded_text(solution_str: str, reward_impl_version: int) -> str:
    """The string the version's scorer sees (used by the format reward so both judge the same text)."""
    return _with_think_prefix(solution_str, check_version(reward_impl_version))


def score_response(
    data_source: str,
    solution_str: str,
    ground_truth,
    extra_info=None,
    reward_impl_version: int = 3,
    grader: str = "math_verify",
    *,
    limits: GuardLimits | None = None,
) -> ScoreResult:
    """Detailed form of ``compute_score``: the full ScoreResult for one raw response.

    Returns within ``limits.time_budget_s`` (default ``GuardLimits()``: 3 s) in any thread; see
    ``deepscaler.rewards.bounded``.
    """
    select_score_fn(data_source, reward_impl_version, grader)  # bad arguments raise, not time out
    return _score_bounded(
        data_source, solution_str, ground_truth, extra_info, reward_impl_version, grader, limits=limits
    )


@bounded
def _score_bounded(data_source, solution_str, ground_truth, extra_info, reward_impl_version, grader) -> ScoreResult:
    del extra_info  # part of verl's signature; no scorer needs it
    if is_non_finite(ground_truth):  # a NaN/inf reference is broken data: \boxed{nan} must not match it
        return ScoreResult(fail_success_values(reward_impl_version)[0], False, parse_failed=True)
    if data_source == GSM8K_SOURCE:
        warn_gsm8k_boxed(solution_str, reward_impl_version)
    return select_score_fn(data_source, reward_impl_version, grader)(solution_str, ground_truth)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth,
    extra_info=None,
    reward_impl_version: int = 3,
    grader: str = "math_verify",
    *,
    limits: GuardLimits | None = None,
) -> float:
    """verl-style entry point: the reward of one raw decoded response (LUFFY default: version 3)."""
    return score_response(
        data_source, solution_str, ground_truth, extra_info, reward_impl_version, grader, limits=limits
    ).score


def grade(
    solution_str: str,
    ground_truth,
    grader: str = "math_verify",
    split_think: bool = False,
    *,
    limits: GuardLimits | None = None,
) -> bool:
    """Evaluation grading: is ``solution_str`` correct?

    ``split_think=True`` keeps only the text after the first ``</think>`` and returns False when the tag
    is missing (LUFFY's eval flow for prompts ending in ``<think>\\n``); otherwise the whole string is
    graded. ``grader``: ``math_verify`` | ``rule`` | ``any``. Bounded like ``score_response`` (a timeout
    is False; ``grade_solution`` gives the full ScoreResult with ``timed_out``).
    """
    if is_non_finite(ground_truth):
        return False
    if split_think:
        solution = split_after_think(solution_str)
        if solution is None:
            return False
        solution_str = solution
    return grade_solution(solution_str, ground_truth, grader, limits=limits).correct


@dataclasses.dataclass(frozen=True)
class ScorerSpec:
    """Picklable description of the scorer a pool worker builds (callables cannot cross ``spawn``)."""

    reward_impl_version: int = 3
    grader: str = "math_verify"
    # Input-guard limits and time budget of each item (None: ``GuardLimits()``).
    limits: GuardLimits | None = None

    def __post_init__(self):
        check_version(self.reward_impl_version)
        if self.grader not in GRADERS:
            raise ValueError(f"reward.grader must be one of {GRADERS}, got {self.grader!r}")
        if self.limits is not None and not isinstance(self.limits, GuardLimits):
            raise TypeError(f"ScorerSpec.limits must be GuardLimits or None, got {type(self.limits).__name__}")

    def warm_up(self) -> None:
        """Run both graders once so regexes and the LaTeX parser exist before real items arrive."""
        warm_graders()
        sample = "<think>\nwarm up\n</think>\nThe answer is $\\boxed{\\frac{1}{2}}$."
        score_response("warmup", sample, "0.5", None, 3, "any")
        score_response("warmup", sample, "0.5", None, self.reward_impl_version, self.grader)

    def score(self, data_source: str, solution_str: str, ground_truth, extra_info=None) -> ScoreResult:
        return score_response(
            data_source,
            solution_str,
            ground_truth,
            extra_info,
            self.reward_impl_version,
            self.grader,
            limits=self.limits,
        )


# Responses that walk every parser path once: LaTeX fractions, roots and powers (latex2sympy's ANTLR
# parser, built lazily), plain numbers, a wrong answer (the rule grader's simplify), text without a box.
_WARM_SAMPLES = (
    ("The answer is $\\boxed{\\frac{1}{2}}$.", "0.5"),
    ("So $x = \\boxed{2\\sqrt{3}+x^{2}}$.", "x^2 + 2\\sqrt{3}"),
    ("Final: \\boxed{42}", "41"),
    ("The result is 7.", "7"),
    ("$\\boxed{\\dfrac{\\pi}{4}}$", "\\frac{\\pi}{4}"),
)


def _warm_every_grader(limits: GuardLimits) -> None:
    """``bounded.warm_graders``' routine: math-verify's path (version 3) and the deepscaler rule grader's (1)."""
    for version in (3, 1):
        for text, truth in _WARM_SAMPLES:
            score_response("warmup", "<think>\nwarm up\n</think>\n" + text, truth, None, version, "any", limits=limits)


set_warm_routine(_warm_every_grader)
