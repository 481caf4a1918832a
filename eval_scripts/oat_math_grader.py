"""LUFFY's OAT grader entry points (``eval_scripts/oat_math_grader.py`` in LUFFY's layout), on this project's
graders.

``boxed_reward_fn(model_response, gt_answer, fast=False)`` returns ``({"formatted": bool}, reward)``:
the last ``\\boxed{}`` (or ``\\fbox{}``) of the response is the answer (none: unformatted, 0.0); it is
right when it equals any ground truth (a boxed ground truth is unboxed first) under the rule grader
(MATH-style normalisation and symbolic equality, ``deepscaler.rewards.math_utils.answers_match``) or, unless
``fast``, under math-verify, as OAT's ``grade`` does (mathd OR sympy, then math-verify to recall more).
The whole text it is given is searched: LUFFY's ``--add_oat_evaluate`` passes the text after ``</think>``,
or the whole response when ``</think>`` is missing (eval_scripts/grading.py applies that rule).

Differences from OAT's file, on purpose: model text is never handed to ``sympy.parse_expr`` / ``eval``
(OAT's sympy path does that); our rule grader and math-verify's parser take its place, so a rare
answer that only OAT's ``parse_expr`` path accepts can differ.
"""
from __future__ import annotations

from typing import Optional, Union

from deepscaler.rewards.math_reward import ground_truth_list
from deepscaler.rewards.math_utils import answers_match, last_boxed_content
from deepscaler.rewards.math_verify_reward import math_verify_match


def extract_answer(passage: str) -> Optional[str]:
    """The content of the last ``\\boxed{}`` / ``\\fbox{}``, or None."""
    return last_boxed_content(passage) if ("\\boxed" in passage or "\\fbox" in passage) else None


def grade(model_answer: str, gt_answer: str, fast: bool = True) -> bool:
    """One extracted answer against one ground truth (boxed ground truths are unboxed)."""
    truths = ground_truth_list(gt_answer)
    if not truths:
        return False
    gt = truths[0]
    if answers_match(model_answer, gt):
        return True
    if fast:
        return False
    answer = model_answer if "$" in model_answer else f"${model_answer}$"
    return math_verify_match(answer, gt)[0]


def boxed_reward_fn(model_response: str, gt_answer: Union[str, int, float, list], fast: bool = False) -> tuple[dict, float]:
    """OAT's boxed reward: ``({"formatted": True}, 1.0)`` when right, ``(..., 0.0)`` when wrong, and
    ``({"formatted": False}, 0.0)`` when nothing is boxed."""
    model_answer = extract_answer(model_response)
    if model_answer is None:
        return {"formatted": False}, 0.0
    truths = [str(gt_answer)] if isinstance(gt_answer, (int, float, str)) else [str(g) for g in gt_answer]
    correct = any(grade(model_answer, gt, fast) for gt in truths)
    return {"formatted": True}, 1.0 if correct else 0.0
