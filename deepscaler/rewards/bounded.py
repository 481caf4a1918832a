"""``bounded``: the decorator that makes a scorer return within its time budget, in any thread.

Every public scorer that can reach a parser (``deepscaler_score``, ``math_verify_score``,
``grade_solution``, ``score_response``) is wrapped: the call runs under the active ``GuardLimits``
(or the ``limits=`` keyword), with ``deadline.call_with_deadline`` enforcing ``time_budget_s``. A call
that runs out of time returns ``ScoreResult(0.0, False, timed_out=True)``; a call in which an input
guard refused something and that did not grade the answer correct comes back with
``parse_failed=True, unparseable=True`` (its score is the scorer's own: 0 for the 1/0 versions).
Nested wrapped calls share the outermost budget. math-verify and latex2sympy are imported (and the
guards installed) before the clock starts.
"""
from __future__ import annotations

import dataclasses
import functools

from deepscaler.rewards.guarded_math_verify import install_guards
from deepscaler.rewards.math_utils.deadline import call_with_deadline
from deepscaler.rewards.math_utils.input_guard import GuardLimits, limits_scope, rejections
from deepscaler.rewards.reward_types import ScoreResult

TIMED_OUT = ScoreResult(0.0, False, timed_out=True)


def bounded(fn):
    """Wrap ``fn(...) -> ScoreResult``; adds a keyword-only ``limits: GuardLimits | None``."""

    @functools.wraps(fn)
    def wrapper(*args, limits: GuardLimits | None = None, **kwargs) -> ScoreResult:
        # Imports happen outside the budget: an import cut by the watchdog would leave half a module.
        install_guards()
        with limits_scope(limits) as active:
            before = rejections()[0]
            finished, result = call_with_deadline(lambda: fn(*args, **kwargs), active.time_budget_s)
            if not finished:
                _restore_sympy_parameters()
                return TIMED_OUT
            if rejections()[0] > before and not result.correct and not result.unparseable:
                result = dataclasses.replace(result, parse_failed=True, unparseable=True)
            return result

    return wrapper


def _restore_sympy_parameters() -> None:
    """SymPy's evaluate/distribute switches are thread-local and set by ``with evaluate(False)`` blocks;
    an interrupted block must not leave this thread's later grading unevaluated."""
    from sympy.core.parameters import global_parameters

    for name in ("evaluate", "distribute"):
        if getattr(global_parameters, name) is not True:
            setattr(global_parameters, name, True)
