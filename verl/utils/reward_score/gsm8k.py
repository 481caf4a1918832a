"""verl's GSM8K scorer under LUFFY's path ``verl.utils.reward_score.gsm8k``.

``compute_score`` with ``method='strict'`` is this package's ``openai/gsm8k`` scorer (the one the reward
manager routes to); ``extract_solution`` keeps verl's extraction rules for scripts that call it.
"""

from __future__ import annotations

import re
from typing import Optional

from deepscaler.rewards.verl_scorers import gsm8k_score

__all__ = ["compute_score", "extract_solution"]

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> Optional[str]:
    """``strict``: the number after ``#### `` (commas and ``$`` removed); ``flexible``: the last number."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    if method == "strict":
        found = _STRICT.search(solution_str)
        return None if found is None else found.group(1).replace(",", "").replace("$", "")
    candidates = [n for n in _NUMBER.findall(solution_str) if n not in ("", ".")]
    return candidates[-1] if candidates else None


def compute_score(
    solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` for a right final answer, ``format_score`` for a wrong one, 0 when there is none."""
    if method == "strict":
        result = gsm8k_score(solution_str, ground_truth)
        if result.parse_failed:
            return 0.0
        return score if result.correct else format_score
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == str(ground_truth) else format_score
