"""Value checks shared by the data loaders and the graders: non-finite or unusable answers and blank prompts.

A ground truth of NaN or infinity (a float, or a string such as ``"nan"`` / ``"-inf"`` that Python's
``float`` reads as one) is a broken row, never an answer: the loaders refuse it with the file and row,
and the graders score it wrong, so ``\\boxed{nan}`` cannot earn a reward. LaTeX ``\\infty`` is a real
answer and passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from deepscaler.rewards.finite import is_non_finite  # noqa: F401 - the loaders' check is the graders'


def prompt_is_blank(messages) -> bool:
    """True when every message of a chat prompt has empty or whitespace-only content."""
    return all(not str(m.get("content", "")).strip() for m in messages if isinstance(m, Mapping))


def ground_truth_problem(value: Any) -> str | None:
    """Why a ground truth cannot be graded (None when it can).

    The graders take a string or number, or a non-empty list of them (any one may match). A dict, a
    nested list, an empty or blank string, an empty list and NaN/inf are refused: the graders would
    turn a dict into its keys, a blank into "no reference" and NaN into a matchable "nan", so every
    such row would silently score 0 (or reward a response answering nan).
    """
    if value is None:
        return "is missing (null)"
    if isinstance(value, Mapping):
        return f"is a dict ({_short(value)}); expected a string, a number or a list of them"
    if isinstance(value, (bool, np.bool_)):
        return f"is a boolean ({value!r}); expected a string, a number or a list of them"
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if not items:
            return "is an empty list"
        for i, item in enumerate(items):
            problem = ground_truth_problem(item)
            if problem is None and isinstance(item, (list, tuple, np.ndarray)):
                problem = "is a nested list"
            if problem is not None:
                return f"item {i} {problem}"
        return None
    if isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if not text.strip():
            return "is empty"
    elif not isinstance(value, (int, float, np.integer, np.floating)):
        return f"has type {type(value).__name__}; expected a string, a number or a list of them"
    if is_non_finite(value):
        return f"{value!r} is NaN/infinite (such a row would reward a response answering nan)"
    return None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
