"""Math-verify scorers: LUFFY's reward (version 3) and its no-think variant (version 4).

Version 3 requires ``<think>`` and ``</think>`` in the string, grades the text between the first and
the second ``</think>``, parses the gold as ``"$" + ground_truth + "$"`` and returns 1.0 iff
``verify(gold, parse(solution))``. Math-verify runs behind the input guards with its own timeouts
disabled (``guarded_math_verify``: its SIGALRM timer raises in threads and threaded Ray actors,
docs/CPU_STACK.md §6); the public scorers here are ``@bounded`` (time budget in any thread).
"""

from __future__ import annotations

from deepscaler.rewards.bounded import bounded
from deepscaler.rewards.guarded_math_verify import guarded_parse, guarded_verify
from deepscaler.rewards.math_reward import grade_solution_rule, ground_truth_list
from deepscaler.rewards.math_utils import extract_choice_letter, is_choice_ground_truth, split_after_think
from deepscaler.rewards.math_utils.extract import THINK_CLOSE, THINK_OPEN
from deepscaler.rewards.reward_types import ScoreResult
from deepscaler.rewards.finite import is_non_finite

GRADERS = ("math_verify", "rule", "any")


def math_verify_match(solution: str, ground_truth: str) -> tuple[bool, bool, str | None]:
    """(correct, parse_failed, answer) for one solution text and one ground truth via math-verify.

    Both sides go through ``guarded_parse`` (input guards in front of math-verify's parsers, tree
    check after), so nothing beyond the active ``GuardLimits`` is ever evaluated.
    """
    gold = guarded_parse("$" + ground_truth + "$")
    pred = guarded_parse(solution)
    if not pred:
        return False, True, None
    answer = str(pred[-1])[:2000]
    if not gold:
        return False, False, answer
    return guarded_verify(gold, pred), False, answer


@bounded
def grade_solution(solution: str, ground_truth, grader: str = "math_verify") -> ScoreResult:
    """Grade a solution section (no think handling) with the chosen grader; binary ScoreResult.

    ``grader``: ``math_verify`` (LUFFY's choice), ``rule`` (``math_utils`` on the last boxed or stated
    answer) or ``any`` (correct if either says so). With ``rule`` and ``any``, option-letter ground truths are
    graded by the extracted letter (boxed letter or ``ANSWER: X``); ``math_verify`` treats them as LUFFY's
    math-verify reward does (no letter rule: ``\\boxed{c}`` is right, ``ANSWER: C`` is not).
    """
    if grader not in GRADERS:
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")
    ground_truths = ground_truth_list(ground_truth)
    if not ground_truths or is_non_finite(ground_truths):  # NaN/inf reference: broken data, never a match
        return ScoreResult(0.0, False, parse_failed=True)
    if grader != "math_verify" and all(is_choice_ground_truth(gt) for gt in ground_truths):
        if extract_choice_letter(solution) is None:
            return ScoreResult(0.0, False, parse_failed=True)
        return grade_solution_rule(solution, ground_truths)
    if grader == "rule":
        return grade_solution_rule(solution, ground_truths)
    parse_failed, answer = True, None
    for gt in ground_truths:
        correct, failed, answer_mv = math_verify_match(solution, gt)
        parse_failed = parse_failed and failed
        answer = answer or answer_mv
        if correct:
            return ScoreResult(1.0, True, answer=answer)
    if grader == "any":
        rule = grade_solution_rule(solution, ground_truths)
        if rule.correct:
            return rule
        parse_failed = parse_failed and rule.parse_failed
        answer = rule.answer or answer
    return ScoreResult(0.0, False, parse_failed=parse_failed, answer=answer)


@bounded
def math_verify_score(text: str, ground_truth, require_think: bool = True, grader: str = "math_verify") -> ScoreResult:
    """Version 3 (``require_think=True``) or version 4 (``False``) on a full response string."""
    if require_think:
        if THINK_OPEN not in text or THINK_CLOSE not in text:
            return ScoreResult(0.0, False, parse_failed=True)
        solution = split_after_think(text)
    else:
        solution = text
    return grade_solution(solution, ground_truth, grader)
