"""Rule-based scorers: the deepscaler reward (LUFFY's versions 0-2) and the rule grader for any text.

The deepscaler convention (docs/METHOD.md §4.1): the solution is the text after the first ``</think>``
(missing tag = format error), the answer is its last ``\\boxed{}`` (none = format error), the ground
truth may be a list and may itself be boxed, and the answer is right if it matches any ground truth
under LUFFY's own rule (``math_utils.luffy_rule``: mathd normalisation OR its sympy rule; verdicts
checked against LUFFY's code in tests/deepscaler/rewards/test_luffy_grader_agreement.py). Version 1
uses the same grader with rewards 1 / -0.5 / -1. ``grade_solution_rule`` (the ``rule`` grader of
versions 3/4 and the eval) is this project's more lenient grader (``math_utils.answers_match``).
LUFFY's own entry points are thin aliases at the end: ``RewardMathFn`` and ``deepscaler_reward_fn``.
"""

from __future__ import annotations

from typing import List, Sequence, Union

from deepscaler.rewards.bounded import bounded
from deepscaler.rewards.math_utils import (
    answers_match,
    extract_choice_letter,
    extract_final_answer,
    is_choice_ground_truth,
    last_boxed_content,
    split_after_think,
)
from deepscaler.rewards.math_utils.extract import THINK_CLOSE, THINK_OPEN
from deepscaler.rewards.math_utils.input_guard import rejections
from deepscaler.rewards.math_utils.luffy_rule import flag_beyond_limits, luffy_answers_match, luffy_boxed_answer
from deepscaler.rewards.luffy_reward_types import RewardConfig, RewardFn, RewardInput, RewardOutput, RewardType
from deepscaler.rewards.reward_types import RewardValues, ScoreResult
from deepscaler.system_prompts import ORM_USER_TEMPLATE  # noqa: F401 - LUFFY's name in this module

# LUFFY's module names (its scripts import the delimiters from here; ORM_USER_TEMPLATE is the judge's prompt).
THOUGHT_DELIMITER_START, THOUGHT_DELIMITER_END = THINK_OPEN, THINK_CLOSE
BINARY_VALUES = RewardValues(correct=1.0, incorrect=0.0, format_error=0.0, unknown_error=0.0)
# LUFFY's reward_with_format.deepscaler_reward_fn_impl1.
IMPL1_VALUES = RewardValues(correct=1.0, incorrect=-0.5, format_error=-1.0, unknown_error=-1.0)


def ground_truth_list(ground_truth) -> list[str]:
    """Ground truths as strings: a scalar becomes a one-item list, boxed ground truths are unboxed."""
    if ground_truth is None:
        return []
    if isinstance(ground_truth, (str, int, float)):
        items: Sequence = [ground_truth]
    else:
        items = list(ground_truth)
    out = []
    for item in items:
        text = str(item).strip()
        if "\\boxed" in text or "\\fbox" in text:
            boxed = last_boxed_content(text)
            if boxed is None:
                continue
            text = boxed
        if text:
            out.append(text)
    return out


@bounded
def grade_solution_rule(solution: str, ground_truths: list[str]) -> ScoreResult:
    """Rule-grade a solution section (no think handling): option letter or last boxed/stated answer.

    Returns a binary ScoreResult; ``parse_failed`` when no answer can be extracted.
    """
    if ground_truths and all(is_choice_ground_truth(gt) for gt in ground_truths):
        letter = extract_choice_letter(solution)
        if letter is None:
            return ScoreResult(0.0, False, parse_failed=True)
        correct = any(answers_match(letter, gt) for gt in ground_truths)
        return ScoreResult(float(correct), correct, answer=letter)
    answer = extract_final_answer(solution)
    if answer is None:
        return ScoreResult(0.0, False, parse_failed=True)
    correct = any(answers_match(answer, gt) for gt in ground_truths)
    return ScoreResult(float(correct), correct, answer=answer)


def luffy_ground_truths(ground_truth) -> list[str]:
    """Ground truths as LUFFY's ``RewardMathFn`` reads them: a scalar is a one-item list, each item is
    ``str()``-ed, a boxed one is replaced by its (LUFFY-)unboxed content and dropped when that fails."""
    if ground_truth is None:
        return []
    items = [ground_truth] if isinstance(ground_truth, (str, int, float)) else list(ground_truth)
    out = []
    for item in items:
        text = str(item)
        if "\\boxed" in text:
            unboxed = luffy_boxed_answer(text)
            if unboxed is not None:
                out.append(unboxed)
        else:
            out.append(text)
    return out


@bounded
def deepscaler_score(text: str, ground_truth, values: RewardValues = BINARY_VALUES) -> ScoreResult:
    """LUFFY's deepscaler grader on a full response string (``<think>`` prefix already added).

    Verdicts are LUFFY's (``math_utils.luffy_rule``): the text between the first and second
    ``</think>``, its last ``\\boxed{}`` (an ``\\fbox`` or a missing box is a format error), equal to a
    ground truth under mathd normalisation or LUFFY's sympy rule. Option-letter ground truths get no
    special treatment, as in LUFFY (``\\boxed{C}`` and ``\\boxed{c}`` are right, ``ANSWER: C`` is unboxed).
    """
    solution = split_after_think(text)
    if solution is None:
        return ScoreResult(values.format_error, False, parse_failed=True)
    answer = luffy_boxed_answer(solution)
    if answer is None:
        return ScoreResult(values.format_error, False, parse_failed=True)
    ground_truths = luffy_ground_truths(ground_truth)
    if not ground_truths:
        return ScoreResult(values.unknown_error, False, parse_failed=True)
    rejections_before = rejections()[0]
    if any(luffy_answers_match(answer, gt) for gt in ground_truths):
        return ScoreResult(values.correct, True, answer=answer)
    # Beyond the project's guards (recorded here or by luffy_answers_match): wrong, and flagged unparseable.
    flag_beyond_limits(answer)
    return ScoreResult(values.incorrect, False, parse_failed=rejections()[0] > rejections_before, answer=answer)


def deepscaler_score_nothink(text: str, ground_truth) -> ScoreResult:
    """Version 2: grade ``"<think>\\n</think>\\n" + text`` with the binary deepscaler grader.

    Kept literally, including LUFFY's quirk: when ``text`` itself contains ``</think>``, the graded
    section ends there, so only the response's think part is graded.
    """
    return deepscaler_score("<think>\n</think>\n" + text, ground_truth, BINARY_VALUES)


class RewardMathFn(RewardFn):
    """LUFFY's deepscaler ``RewardMathFn``: both think tags required, the last ``\\boxed{}`` after the first
    ``</think>`` graded against every ground truth with the rule grader; rewards from ``RewardConfig``.

    ``config.use_math_orm=True`` asks ``judge`` (a ``deepscaler.rewards.orm.OrmJudge``, or anything with its
    ``judge(problem, reference, response)`` method) about answers the rule grader marked wrong.
    """

    def __init__(self, config: RewardConfig, judge=None):
        super().__init__(config)
        if config.use_math_orm and judge is None:
            raise ValueError(
                "RewardConfig.use_math_orm=True needs a judge: RewardMathFn(config, judge=OrmJudge("
                "OrmConfig(base_url=..., model=...))); in training set reward.orm.*"
            )
        self.judge = judge

    def __call__(self, input: RewardInput) -> RewardOutput:  # noqa: A002 (LUFFY's parameter name)
        if input.problem_type != RewardType.MATH:
            raise ValueError(f"RewardMathFn grades MATH problems, got problem_type={input.problem_type}")
        cfg = self.config
        values = RewardValues(cfg.correct_reward, cfg.incorrect_reward, cfg.format_error_reward, cfg.unk_error_reward)
        if THINK_OPEN not in input.model_response:
            return RewardOutput(cfg.format_error_reward, False)
        ground_truth = (input.ground_truth or {}).get("answer")
        result = deepscaler_score(input.model_response, ground_truth, values)
        if not result.correct and cfg.use_math_orm and result.answer is not None:
            for gt in ground_truth_list(ground_truth):
                if self.judge.judge(input.problem, gt, result.answer).verdict:
                    return RewardOutput(cfg.correct_reward, True)
        return RewardOutput(result.score, result.correct)


def deepscaler_reward_fn(
    solution_str: str, ground_truth: Union[str, List[str]], enable_llm: bool = False, judge=None
) -> bool:
    """LUFFY's entry point: whether ``solution_str`` (think tags included) answers ``ground_truth``."""
    fn = RewardMathFn(RewardConfig(use_math_orm=enable_llm), judge=judge)
    return fn(
        RewardInput(
            problem=solution_str,
            problem_type=RewardType.MATH,
            model_response=solution_str,
            ground_truth={"answer": ground_truth},
        )
    ).is_correct
