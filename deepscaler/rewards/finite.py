"""Whether a value is NaN or infinity: a float, or a string such as ``"nan"`` / ``"-inf"`` that Python's ``float``
reads as one (LaTeX ``\\infty`` is a real answer and is not). The graders score such an answer wrong and the data
loaders (verl/utils/dataset/value_checks.py) refuse such a ground truth; it lives here, with no dependency, so the
rewards import nothing from verl.
"""

from __future__ import annotations

import math
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
