"""LUFFY's OAT grader (``eval_scripts/oat_math_grader.py``, behind ``--add_oat_evaluate``), rewritten safely.

``boxed_reward_fn(model_response, gt_answer, fast=False)`` returns ``({"formatted": bool}, reward)`` with
LUFFY's verdicts (checked against LUFFY's own code in tests/deepscaler/rewards/test_luffy_grader_agreement.py):

- the answer is the content of the last ``\\boxed{...}`` (``math_utils.luffy_rule.luffy_boxed_answer``); a
  response without ``\\boxed`` (an ``\\fbox`` only, or nothing) is unformatted, 0.0;
- ``grade``: a boxed ground truth is unboxed; right when OAT's mathd normalisation (with its unit words)
  or LUFFY's sympy rule says so (``luffy_rule.luffy_answers_match(..., oat=True)``), or, unless ``fast``,
  ``is_latex_equal``: the two answers' sympy-normalised strings are equal, or math-verify (gold and answer
  wrapped in ``$`` when they have none, LaTeX with boxed priority plus plain expressions, no fallback)
  verifies them. Answers over 128 characters that repeat themselves (``repeatness``) never match there.

What differs from OAT's file is only how: model text never reaches ``sympy.parse_expr`` / ``eval`` (the
sympy rule uses ``luffy_rule.parse_plain``), math-verify runs behind this project's input guards with its
SIGALRM timers off, and every call is bounded by the caller's grading deadline.
The whole text it is given is searched: LUFFY's ``--add_oat_evaluate`` passes the text after ``</think>``,
or the whole response when ``</think>`` is missing (eval_scripts/grading.py applies that rule).
"""

from __future__ import annotations

from os.path import commonprefix
from typing import Optional, Union

from deepscaler.rewards.bounded import bounded
from deepscaler.rewards.guarded_math_verify import guarded_parse, guarded_verify
from deepscaler.rewards.math_utils.luffy_normalize import sympy_normalize
from deepscaler.rewards.math_utils.luffy_rule import answer_within_limits, luffy_answers_match, luffy_boxed_answer
from deepscaler.rewards.reward_types import ScoreResult

REPEAT_CHECK_CHARS = 128  # OAT skips math-verify for longer answers that mostly repeat themselves


def extract_answer(passage: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}``, or None (OAT's ``extract_answer``)."""
    return luffy_boxed_answer(passage)


def repeatness(s: str) -> bool:
    """True when the suffixes of ``s`` share, on average, long prefixes: the sum of the longest common
    prefixes of neighbouring sorted suffixes is over 20 % of the ``n(n+1)/2`` substrings."""
    n = len(s)
    if n <= 1:
        return False
    suffixes = sorted(range(n), key=lambda i: s[i:])
    shared = sum(len(commonprefix([s[a:], s[b:]])) for a, b in zip(suffixes, suffixes[1:]))
    return shared * 2 / (n * (n + 1)) > 0.2


def _mv_parse(text: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    # OAT passes extraction_mode as a one-item list, which math-verify reads as "any_match": kept as is.
    return guarded_parse(
        text,
        extraction_config=(LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()),
        fallback_mode="no_fallback",
        extraction_mode=["first_match"],
    )


def is_latex_equal(given_answer: str, ground_truth: Optional[str]) -> bool:
    """OAT's math-verify recall step (see the module docstring)."""
    if ground_truth is None:
        return False
    if (len(given_answer) > REPEAT_CHECK_CHARS and repeatness(given_answer)) or (
        len(ground_truth) > REPEAT_CHECK_CHARS and repeatness(ground_truth)
    ):
        return False
    gt_norm = sympy_normalize(ground_truth)
    if gt_norm is None:
        return False
    if gt_norm == sympy_normalize(given_answer):
        return True
    given = given_answer if "$" in given_answer else f"${given_answer}$"
    gold = ground_truth if "$" in ground_truth else f"${ground_truth}$"
    try:
        return guarded_verify(_mv_parse(gold), _mv_parse(given))
    except Exception:  # noqa: BLE001 - OAT counts any math-verify failure as "not equal"
        return False


def grade(model_answer: str, gt_answer: str, fast: bool = True) -> bool:
    """One extracted answer against one ground truth (a boxed ground truth is unboxed first)."""
    if "\\boxed" in gt_answer:
        gt_answer = luffy_boxed_answer(gt_answer)
        if gt_answer is None:
            return False
    if luffy_answers_match(model_answer, gt_answer, oat=True):
        return True
    if fast or not answer_within_limits(model_answer):
        return False
    return is_latex_equal(model_answer, gt_answer)


@bounded
def _grade_bounded(model_answer: str, truths: list[str], fast: bool) -> ScoreResult:
    correct = any(grade(model_answer, gt, fast) for gt in truths)
    return ScoreResult(float(correct), correct, answer=model_answer)


def boxed_reward_fn(
    model_response: str, gt_answer: Union[str, int, float, list], fast: bool = False
) -> tuple[dict, float]:
    """OAT's boxed reward: ``({"formatted": True}, 1.0)`` when right, ``(..., 0.0)`` when wrong, and
    ``({"formatted": False}, 0.0)`` when nothing is boxed. Grading runs within the active
    ``GuardLimits().time_budget_s`` in any thread; a spent budget gives 0.0 with ``"timed_out": True``."""
    model_answer = extract_answer(model_response)
    if model_answer is None:
        return {"formatted": False}, 0.0
    truths = [str(gt_answer)] if isinstance(gt_answer, (int, float, str)) else [str(g) for g in gt_answer]
    result = _grade_bounded(model_answer, truths, fast)
    info = {"formatted": True, "timed_out": True} if result.timed_out else {"formatted": True}
    return info, 1.0 if result.correct else 0.0
