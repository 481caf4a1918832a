"""verl's MATH scorer under LUFFY's path ``verl.utils.reward_score.math``.

``compute_score`` is this package's ``lighteval/MATH`` scorer (last ``\\boxed{}`` against the ground truth
after MATH's string normalisation, no symbolic step); ``is_equiv`` / ``strip_string`` expose that
normalisation and the ``fix_*`` helpers its steps (``deepscaler.rewards.math_utils.normalize``).
"""

from __future__ import annotations

from typing import Optional

from deepscaler.rewards.math_utils import normalize as _norm
from deepscaler.rewards.math_utils.utils import last_boxed_only_string as _last_boxed
from deepscaler.rewards.verl_scorers import math_dataset_score

__all__ = [
    "compute_score",
    "fix_a_slash_b",
    "fix_fracs",
    "fix_sqrt",
    "is_equiv",
    "last_boxed_only_string",
    "remove_boxed",
    "remove_right_units",
    "strip_string",
]

fix_fracs = _norm._fix_fracs
fix_sqrt = _norm._fix_sqrt
fix_a_slash_b = _norm._fix_simple_slash_fraction
remove_right_units = _norm._strip_units


def compute_score(solution_str: str, ground_truth) -> float:
    return float(math_dataset_score(solution_str, ground_truth).score)


def strip_string(string: str) -> str:
    """MATH's normalised comparison form of an answer."""
    return _norm.match_key(_norm.clean_answer(string))


def is_equiv(str1: Optional[str], str2: Optional[str], verbose: bool = False) -> bool:
    """Equal after ``strip_string``; two Nones are equal, one None is not."""
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    a, b = strip_string(str1), strip_string(str2)
    if verbose:
        print(a, b)
    return a == b


def last_boxed_only_string(string: str) -> Optional[str]:
    """The last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed X`` up to a ``$``), command included."""
    spaced = string.rfind("\\boxed ")
    braced = _last_boxed(string)
    if spaced >= 0 and (braced is None or spaced > string.rfind(braced)):
        return "\\boxed " + string[spaced + len("\\boxed ") :].split("$")[0]
    return braced


def remove_boxed(s: str) -> str:
    """``\\boxed X`` / ``\\boxed{X}`` -> ``X``; ValueError for anything else."""
    for left, right in (("\\boxed ", ""), ("\\boxed{", "}")):
        if s.startswith(left) and s.endswith(right):
            return s[len(left) : len(s) - len(right)]
    raise ValueError(f"not a boxed answer: {s[:80]!r}")
