"""Wall-clock budget for one grading call, in any thread, without signals or a process pool.

``call_with_deadline(fn, budget_s)`` runs ``fn`` in the calling thread and ends it with ``GradeTimeout``
when the budget is spent. Two mechanisms, because neither is enough alone:
- cooperative: ``check_deadline()`` raises once the budget is spent; the guarded parser wrappers call it
  before every parse, so a response with thousands of failing candidates stops between two of them;
- watchdog: one daemon thread per process raises ``GradeTimeout`` asynchronously in the grading thread
  (CPython's ``PyThreadState_SetAsyncExc``), which interrupts slow *Python* code (SymPy's simplify,
  ANTLR's prediction) anywhere. It cannot interrupt one long C call (a big-integer power): the
  pre-parse guards (``input_guard``) exist so that no such call is ever started.
``GradeTimeout`` derives from ``BaseException`` so that math-verify's and SymPy's ``except Exception``
handlers cannot swallow it and turn a timeout into "wrong answer".
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")

_local = threading.local()


class GradeTimeout(BaseException):
    """The grading call ran past its wall-clock budget (a BaseException so that no grader swallows it)."""


def check_deadline() -> None:
    """Raise ``GradeTimeout`` when the calling thread's grading budget is spent (no-op outside one)."""
    deadline = getattr(_local, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise GradeTimeout()


def remaining_s() -> float | None:
    deadline = getattr(_local, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()


def _set_async_exc(thread_id: int, exc_type) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc_type) if exc_type is not None else None)


class _Watchdog:
    """One daemon thread that raises ``GradeTimeout`` in threads whose armed deadline passed."""

    def __init__(self):
        self._cv = threading.Condition(threading.Lock())
        self._armed: dict[int, list] = {}  # thread id -> [deadline, fired]
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def _ensure_thread(self) -> None:
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="grade-watchdog", daemon=True)
            self._thread.start()

    def arm(self, thread_id: int, deadline: float) -> None:
        with self._cv:
            self._ensure_thread()
            self._armed[thread_id] = [deadline, False]
            self._cv.notify()

    def disarm(self, thread_id: int) -> None:
        with self._cv:
            entry = self._armed.pop(thread_id, None)
            if entry is not None and entry[1]:
                # Fired but maybe not yet delivered: withdraw it so it cannot hit the caller later.
                _set_async_exc(thread_id, None)

    def _run(self) -> None:
        with self._cv:
            while True:
                now = time.monotonic()
                next_due = None
                for thread_id, entry in self._armed.items():
                    if entry[1]:
                        continue
                    if entry[0] <= now:
                        entry[1] = True
                        _set_async_exc(thread_id, GradeTimeout)
                    elif next_due is None or entry[0] < next_due:
                        next_due = entry[0]
                self._cv.wait(None if next_due is None else max(0.001, next_due - now))

    def _after_fork(self) -> None:
        # The child has no watchdog thread and no armed callers; start afresh on first use.
        self._cv = threading.Condition(threading.Lock())
        self._armed = {}
        self._thread = None


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG._after_fork)


def call_with_deadline(fn: Callable[[], T], budget_s: float | None) -> tuple[bool, T | None]:
    """``(True, fn())``, or ``(False, None)`` when ``fn`` ran past ``budget_s`` seconds.

    Nested calls run under the outermost budget (an inner call never extends it). ``budget_s=None``
    runs ``fn`` with no limit.
    """
    if budget_s is None or getattr(_local, "deadline", None) is not None:
        return True, fn()
    thread_id = threading.get_ident()
    try:
        _local.deadline = time.monotonic() + float(budget_s)
        _WATCHDOG.arm(thread_id, _local.deadline)
        try:
            return True, fn()
        finally:
            _local.deadline = None
            _WATCHDOG.disarm(thread_id)
    except GradeTimeout:
        _local.deadline = None
        _WATCHDOG.disarm(thread_id)
        return False, None
