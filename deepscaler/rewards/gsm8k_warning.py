"""One-time warning for ``openai/gsm8k`` rows answered with ``\\boxed{}`` instead of ``#### N``.

LUFFY routes the data source ``openai/gsm8k`` to verl's strict scorer (docs/METHOD.md §4.1), which only
reads a final ``#### <number>`` line, whatever ``data.reward_impl_version`` says. A model prompted the
LUFFY way answers in ``\\boxed{}``, so every such response scores 0 without any error. The first time
this happens in a process we say so, and name the setting that grades boxed answers.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)

MESSAGE = (
    "data_source 'openai/gsm8k' is graded by verl's strict '####' scorer (docs/METHOD.md §4.1), whatever "
    "data.reward_impl_version is: a response with a \\boxed{} answer and no '#### <number>' line scores 0. "
    "To grade boxed answers, give these rows another data_source (data/prepare_train.py --source gsm8k "
    "writes 'gsm8k') and use data.reward_impl_version=3 (math-verify, LUFFY's default; 4 grades the raw "
    "text, 0-2 use the rule grader). This warning is shown once per process."
)

_lock = threading.Lock()
_warned = [False]


def warn_gsm8k_boxed(solution_str: str, reward_impl_version: int) -> bool:
    """Log the warning once per process when ``solution_str`` has a box and no ``####``; True if logged."""
    if _warned[0]:
        return False
    tail = solution_str[-10_000:]
    if "####" in tail or "\\boxed" not in tail:
        return False
    with _lock:
        if _warned[0]:
            return False
        _warned[0] = True
    logger.warning("%s (first such row graded with reward_impl_version=%s)", MESSAGE, reward_impl_version)
    return True


def reset_gsm8k_warning() -> None:
    """Allow the warning again (tests)."""
    _warned[0] = False
