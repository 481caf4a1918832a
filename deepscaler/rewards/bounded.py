"""``bounded``: the decorator that makes a scorer return within its time budget, in any thread.

Every public scorer that can reach a parser (``deepscaler_score``, ``math_verify_score``,
``grade_solution``, ``score_response``) is wrapped: the call runs under the active ``GuardLimits``
(or the ``limits=`` keyword), with ``deadline.run_with_budget`` enforcing ``time_budget_s`` in the
grading thread's CPU time (a busy machine slows a grade down but never changes its verdict). A call
that spends its budget returns ``ScoreResult(0.0, False, timed_out=True)``; one stopped by the
wall-clock backstop also has ``wall_timed_out=True`` (its own status and metric); a call in which an input
guard refused something and that did not grade the answer correct comes back with
``parse_failed=True, unparseable=True`` (its score is the scorer's own: 0 for the 1/0 versions).
Nested wrapped calls share the outermost budget. math-verify and latex2sympy are imported (and the
guards installed) before the clock starts, and the first wrapped call of a process warms the graders
(``warm_graders``: parser construction, regex compilation, SymPy's caches) without a budget, so the
first grade in a process costs what later ones cost. Which grades warm them is the scorers' business:
``selection`` registers its routine with ``set_warm_routine`` (importing any ``deepscaler.rewards`` module
imports the package, hence ``selection``, first).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time

from deepscaler.rewards.guarded_math_verify import install_guards
from deepscaler.rewards.math_utils.deadline import FINISHED, WALL_TIMEOUT, run_with_budget
from deepscaler.rewards.math_utils.input_guard import GuardLimits, limits_scope, rejections
from deepscaler.rewards.reward_types import ScoreResult

TIMED_OUT = ScoreResult(0.0, False, timed_out=True)
WALL_TIMED_OUT = ScoreResult(0.0, False, timed_out=True, wall_timed_out=True)

logger = logging.getLogger(__name__)
_warm_lock = threading.RLock()
_warm_state = threading.local()
_warmed = False
# What warming grades: set by ``selection`` (the layer that knows every grader) when the package is imported,
# so this bottom layer never imports the scorers it wraps.
_warm_routine = None


def bounded(fn):
    """Wrap ``fn(...) -> ScoreResult``; adds a keyword-only ``limits: GuardLimits | None``."""

    @functools.wraps(fn)
    def wrapper(*args, limits: GuardLimits | None = None, **kwargs) -> ScoreResult:
        # Imports happen outside the budget: an import cut by the watchdog would leave half a module.
        install_guards()
        if not _warmed:
            warm_graders()
        with limits_scope(limits) as active:
            before = rejections()[0]
            status, result = run_with_budget(lambda: fn(*args, **kwargs), active.time_budget_s)
            if status != FINISHED:
                _restore_sympy_parameters()
                return WALL_TIMED_OUT if status == WALL_TIMEOUT else TIMED_OUT
            if rejections()[0] > before and not result.correct and not result.unparseable:
                result = dataclasses.replace(result, parse_failed=True, unparseable=True)
            return result

    return wrapper


def set_warm_routine(routine) -> None:
    """``routine(limits)`` grades a few samples with every grader; ``warm_graders`` runs it once per process."""
    global _warm_routine
    _warm_routine = routine


def warm_graders() -> float:
    """Grade a few samples with every grader once per process, outside any budget; returns the seconds
    it took (0 when already warm). Called by the first bounded call; the scoring workers and the eval
    call it at start-up. Other threads wait for it; nested calls from the warming thread skip it."""
    global _warmed
    if _warmed or getattr(_warm_state, "active", False) or _warm_routine is None:
        return 0.0
    with _warm_lock:
        if _warmed:
            return 0.0
        _warm_state.active = True
        start = time.perf_counter()
        try:
            install_guards()
            _warm_routine(GuardLimits(time_budget_s=600.0))
        except Exception as exc:  # noqa: BLE001 - warming is an optimisation; grading reports real errors
            logger.warning(
                "grader warm-up failed (%s: %s); the first grades pay the cold start", type(exc).__name__, exc
            )
        finally:
            _warm_state.active = False
            _warmed = True
        return time.perf_counter() - start


def _restore_sympy_parameters() -> None:
    """SymPy's evaluate/distribute switches are thread-local and set by ``with evaluate(False)`` blocks;
    an interrupted block must not leave this thread's later grading unevaluated."""
    from sympy.core.parameters import global_parameters

    for name in ("evaluate", "distribute"):
        if getattr(global_parameters, name) is not True:
            setattr(global_parameters, name, True)
