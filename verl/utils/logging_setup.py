"""Console hygiene: one metrics line per step plus the warnings that matter.

Third-party libraries repeat lines that carry no information for a training run: vLLM logs
"reset prefix cache" at INFO on every weight sync, vLLM's kernel dispatcher touches the deprecated
``torch.distributed.reduce_op`` and warns each time. ``setup_logging()`` drops exactly those (named
here, matched by message) on the driver and in every worker; anything else, including all warnings
of this project, stays visible. It is idempotent and cheap, so each process entry point calls it.
"""

from __future__ import annotations

import logging
import re
import warnings

# (logger name, message regex): log records dropped wherever they are logged.
NOISY_RECORDS = (
    ("vllm.v1.core.block_pool", r"reset prefix cache"),
    ("vllm", r"reset(ting)? prefix cache"),
    # vLLM's CPU build at every engine start-up, per worker (they were ~50 start-up lines on the quickstart's
    # console); each names a setting this project chose on purpose (eager mode, in-process engine) or a GPU-only
    # library that a CPU machine cannot have. Start-up INFO lines are off by VLLM_LOGGING_LEVEL (launcher).
    ("vllm", r"global random seed is set to"),
    ("vllm", r"Enforce eager set, disabling torch\.compile"),
    ("vllm", r"Inductor compilation was disabled by user settings"),
    ("vllm", r"Triton is not installed|requires Triton"),
    ("vllm", r"Reset SSM cache type"),
    ("vllm", r"is not found in LD_PRELOAD"),
    ("vllm", r"doesn't allow to use `torch\.set_num_threads`"),
)
# (category, message regex): Python warnings that third-party code raises on every call.
NOISY_WARNINGS = ((FutureWarning, r"`torch\.distributed\.reduce_op` is deprecated"),)


class DropMatching(logging.Filter):
    """Rejects records whose message matches ``pattern`` (case-insensitive)."""

    def __init__(self, pattern: str):
        super().__init__()
        self.regex = re.compile(pattern, re.IGNORECASE)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not self.regex.search(record.getMessage())
        except Exception:  # noqa: BLE001 - a record that cannot format is not ours to drop
            return True


def _attach(target, pattern: str) -> None:
    if not any(isinstance(f, DropMatching) and f.regex.pattern == pattern for f in target.filters):
        target.addFilter(DropMatching(pattern))


def setup_logging() -> None:
    """Install the filters (logger filters for records of that logger, handler filters for its children).

    vLLM replaces its handlers when an engine configures logging (``dictConfig``), which drops handler filters,
    so every logger already created under a named one gets the logger filter too; call this again after
    importing more of a library (the vLLM rollout does, after importing its CPU worker).
    """
    existing = list(logging.Logger.manager.loggerDict)
    for name, pattern in NOISY_RECORDS:
        logger = logging.getLogger(name)
        _attach(logger, pattern)
        for handler in logger.handlers:
            _attach(handler, pattern)
        for child in existing:
            if child.startswith(name + ".") and isinstance(logging.Logger.manager.loggerDict[child], logging.Logger):
                _attach(logging.getLogger(child), pattern)
    for category, pattern in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
