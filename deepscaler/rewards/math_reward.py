"""Rule-based scorers: the deepscaler reward (LUFFY's versions 0-2) and the rule grader for any text.

The deepscaler convention (LUFFY_SPEC §4.1): the solution is the text after the first ``</think>``
(missing tag = format error), the answer is its last ``\\boxed{}`` (none = format error), the ground
truth may be a list and may itself be boxed, and the answer is right if it matches any ground truth
under ``math_utils.answers_match``. Option-letter ground truths (ARC-c, GPQA) also accept an
``ANSWER: X`` line. Version 1 uses the same grader with rewards 1 / -0.5 / -1.
"""
from __future__ import annotations

from typing import Sequence

from deepscaler.rewards.bounded import bounded
from deepscaler.rewards.math_utils import (
    answers_match,
    extract_choice_letter,
    extract_final_answer,
    is_choice_ground_truth,
    last_boxed_content,
    split_after_think,
)
from deepscaler.rewards.reward_types import RewardValues, ScoreResult

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


@bounded
def deepscaler_score(text: str, ground_truth, values: RewardValues = BINARY_VALUES) -> ScoreResult:
    """LUFFY's deepscaler grader on a full response string (``<think>`` prefix already added)."""
    solution = split_after_think(text)
    if solution is None:
        return ScoreResult(values.format_error, False, parse_failed=True)
    ground_truths = ground_truth_list(ground_truth)
    if not ground_truths:
        return ScoreResult(values.unknown_error, False, parse_failed=True)
    if all(is_choice_ground_truth(gt) for gt in ground_truths):
        answer = extract_choice_letter(solution)
    else:
        answer = last_boxed_content(solution)
    if answer is None:
        return ScoreResult(values.format_error, False, parse_failed=True)
    if any(answers_match(answer, gt) for gt in ground_truths):
        return ScoreResult(values.correct, True, answer=answer)
    return ScoreResult(values.incorrect, False, answer=answer)


def deepscaler_score_nothink(text: str, ground_truth) -> ScoreResult:
    """Version 2: grade ``"<think>\\n</think>\\n" + text`` with the binary deepscaler grader.

    Kept literally, including LUFFY's quirk: when ``text`` itself contains ``</think>``, the graded
    section ends there, so only the response's think part is graded.
    """
    return deepscaler_score("<think>\n</think>\n" + text, ground_truth, BINARY_VALUES)
