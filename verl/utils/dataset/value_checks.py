"""Value checks shared by the data loaders and the graders: non-finite answers and blank prompts.

A ground truth of NaN or infinity (a float, or a string such as ``"nan"`` / ``"-inf"`` that Python's
``float`` reads as one) is a broken row, never an answer: the loaders refuse it with the file and row,
and the graders score it wrong, so ``\\boxed{nan}`` cannot earn a reward. LaTeX ``\\infty`` is a real
answer and passes.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def is_non_finite(value: Any) -> bool:
    """True for NaN/inf floats and strings that parse as them; lists are non-finite if any item is."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return any(is_non_finite(v) for v in value)
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return not math.isfinite(float(value))
    if isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        text = text.strip().strip("$").strip()
        try:
            return not math.isfinite(float(text))
        except (ValueError, OverflowError):
            return False
    return False


def prompt_is_blank(messages) -> bool:
    """True when every message of a chat prompt has empty or whitespace-only content."""
    return all(not str(m.get("content", "")).strip() for m in messages if isinstance(m, Mapping))
