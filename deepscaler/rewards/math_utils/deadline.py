"""Time budget for one grading call, in any thread, counted in the grading thread's CPU time.

``run_with_budget(fn, budget_s, backstop_s)`` runs ``fn`` in the calling thread and ends it when the
thread has spent ``budget_s`` seconds of its own CPU time (``CLOCK_THREAD_CPUTIME_ID``), or, as a
backstop, when ``backstop_s`` seconds of wall-clock time have passed. CPU time is the measure because a
verdict must not depend on the neighbours: on a loaded machine a grade that needs 0.4 s of CPU can take
5 s of wall time, and a wall-clock budget would then score a correct answer 0. The backstop only catches
a thread that waits without computing (it should never fire) and is reported as its own status.

Two mechanisms end a call, because neither is enough alone:
- cooperative: ``check_deadline()`` raises once the budget is spent; the guarded parser wrappers call it
  before every parse, so a response with thousands of failing candidates stops between two of them;
- watchdog: one daemon thread per process reads each armed thread's CPU clock and raises
  ``GradeTimeout`` (or ``GradeWallTimeout``) asynchronously in it (CPython's
  ``PyThreadState_SetAsyncExc``), which interrupts slow *Python* code (SymPy's simplify, ANTLR's
  prediction) anywhere. It cannot interrupt one long C call (a big-integer power): the pre-parse guards
  (``input_guard``) exist so that no such call is ever started.
``GradeTimeout`` derives from ``BaseException`` so that math-verify's and SymPy's ``except Exception``
handlers cannot swallow it and turn a timeout into "wrong answer". An asynchronous exception can still be
lost (CPython prints and drops one that lands in a ``__del__`` or weakref callback, which SymPy's caches
run all the time), so the watchdog raises it again while the thread stays armed and keeps computing:
a lost exception must never leave a thread grading without a bound.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")

_local = threading.local()

# Status of ``run_with_budget``.
FINISHED, CPU_TIMEOUT, WALL_TIMEOUT = "finished", "cpu_timeout", "wall_timeout"
# Wall-clock backstop when the caller gives none: generous, because it must never fire on a busy machine.
BACKSTOP_FACTOR, MIN_BACKSTOP_S = 20.0, 60.0
# After firing, raise again when the armed thread has spent this much more CPU (it did not stop) or this
# much wall time has passed (it waits somewhere the exception was dropped).
REFIRE_CPU_S, REFIRE_WALL_S = 0.05, 1.0


def default_backstop_s(budget_s: float) -> float:
    return max(MIN_BACKSTOP_S, BACKSTOP_FACTOR * float(budget_s))


class GradeTimeout(BaseException):
    """The grading call spent its CPU-time budget (a BaseException so that no grader swallows it)."""


class GradeWallTimeout(GradeTimeout):
    """The grading call ran past the wall-clock backstop without spending its CPU budget."""


def _thread_clock(thread_id: int):
    """The CPU-time clock id of thread ``thread_id`` (``threading.get_ident()`` is its pthread id on
    POSIX), or None where the platform has none (then the budget falls back to wall time)."""
    try:
        return time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):
        return None


def _cpu_now(clock) -> float:
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def check_deadline() -> None:
    """Raise ``GradeTimeout`` when the calling thread's grading budget is spent (no-op outside one)."""
    budget = getattr(_local, "budget", None)
    if budget is None:
        return
    cpu_deadline, wall_deadline, clock = budget
    if _cpu_now(clock) > cpu_deadline:
        raise GradeTimeout()
    if time.monotonic() > wall_deadline:
        raise GradeWallTimeout()


def _set_async_exc(thread_id: int, exc_type) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type is not None else None
    )


class _Watchdog:
    """One daemon thread that raises ``GradeTimeout`` in threads whose CPU budget (or backstop) is spent."""

    def __init__(self):
        self._cv = threading.Condition(threading.Lock())
        # thread id -> [cpu deadline, wall deadline, clock, last fire as (cpu, wall) or None, times fired, disarmed]
        self._armed: dict[int, list] = {}
        self._firing: int | None = None  # the thread the watchdog is raising in right now (see disarm)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def _ensure_thread(self) -> None:
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="grade-watchdog", daemon=True)
            self._thread.start()

    def arm(self, thread_id: int, budget: tuple) -> None:
        with self._cv:
            self._ensure_thread()
            self._armed[thread_id] = [*budget, None, 0, False]
            self._cv.notify()

    def disarm(self, thread_id: int) -> None:
        """Stop watching ``thread_id`` (called by that thread) and withdraw an exception fired but not delivered.

        Takes no lock: the exception fired at this thread can land at any bytecode in here, and a lock taken
        here would then stay taken (it did, under load: a timeout landed in ``Condition.__enter__`` right
        after the acquire, and every later grade in the process hung). Every step is idempotent, so a caller
        that catches the exception calls it again (``_disarm``)."""
        entry = self._armed.get(thread_id)
        if entry is not None:
            entry[5] = True  # the watchdog fires at no disarmed entry ...
        while self._firing == thread_id:  # ... and one it is firing at right now is withdrawn after the fire
            time.sleep(0.0002)
        self._armed.pop(thread_id, None)
        _set_async_exc(thread_id, None)

    def _run(self) -> None:
        with self._cv:
            while True:
                now = time.monotonic()
                next_wait = None
                for thread_id, entry in list(self._armed.items()):  # a copy: callers disarm without the lock
                    try:
                        wait = self._visit(thread_id, entry, now)
                    except OSError:  # the thread is gone; its caller disarms it
                        continue
                    next_wait = wait if next_wait is None else min(next_wait, wait)
                self._cv.wait(None if next_wait is None else max(0.002, next_wait))

    def _visit(self, thread_id: int, entry: list, now: float) -> float:
        """Fire (or fire again) at one armed thread when due; return the wall seconds until it may be due."""
        cpu_deadline, wall_deadline, clock, last_fire = entry[:4]
        if entry[5]:
            return REFIRE_WALL_S
        cpu = _cpu_now(clock)
        if last_fire is not None:
            cpu_since, wall_since = cpu - last_fire[0], now - last_fire[1]
            if cpu_since < REFIRE_CPU_S and wall_since < REFIRE_WALL_S:
                return min(REFIRE_CPU_S - cpu_since, REFIRE_WALL_S - wall_since)
        elif cpu < cpu_deadline and now < wall_deadline:
            # A thread gains at most one CPU second per wall second, so nothing can be due sooner.
            return min(cpu_deadline - cpu, wall_deadline - now)
        # Dekker-style with disarm: mark the thread as being fired at, then look at its flag; disarm sets its
        # flag, then waits while it is being fired at. Either this sees the flag or disarm sees the mark.
        self._firing = thread_id
        try:
            if entry[5]:
                return REFIRE_WALL_S
            entry[3], entry[4] = (cpu, now), entry[4] + 1
            _set_async_exc(thread_id, GradeTimeout if cpu >= cpu_deadline else GradeWallTimeout)
        finally:
            self._firing = None
        return min(REFIRE_CPU_S, REFIRE_WALL_S)

    def _after_fork(self) -> None:
        # The child has no watchdog thread and no armed callers; start afresh on first use.
        self._cv = threading.Condition(threading.Lock())
        self._armed = {}
        self._firing = None
        self._thread = None


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG._after_fork)


def _disarm(thread_id: int) -> None:
    """``_WATCHDOG.disarm``, again if the fired exception lands inside it (it is idempotent)."""
    while True:
        try:
            _WATCHDOG.disarm(thread_id)
            return
        except GradeTimeout:
            continue


def run_with_budget(
    fn: Callable[[], T], budget_s: float | None, backstop_s: float | None = None
) -> tuple[str, T | None]:
    """``(FINISHED, fn())``, or ``(CPU_TIMEOUT, None)`` when the calling thread spent ``budget_s`` CPU
    seconds in ``fn``, or ``(WALL_TIMEOUT, None)`` past ``backstop_s`` wall seconds (default
    ``default_backstop_s(budget_s)``).

    Nested calls run under the outermost budget (an inner call never extends it). ``budget_s=None``
    runs ``fn`` with no limit.
    """
    if budget_s is None or getattr(_local, "budget", None) is not None:
        return FINISHED, fn()
    thread_id = threading.get_ident()
    clock = _thread_clock(thread_id)
    backstop = default_backstop_s(budget_s) if backstop_s is None else float(backstop_s)
    try:
        _local.budget = (_cpu_now(clock) + float(budget_s), time.monotonic() + backstop, clock)
        _WATCHDOG.arm(thread_id, _local.budget)
        try:
            return FINISHED, fn()
        finally:
            _local.budget = None
            _disarm(thread_id)
    except GradeTimeout as exc:
        _local.budget = None
        _disarm(thread_id)
        return (WALL_TIMEOUT if isinstance(exc, GradeWallTimeout) else CPU_TIMEOUT), None


def call_with_deadline(
    fn: Callable[[], T], budget_s: float | None, backstop_s: float | None = None
) -> tuple[bool, T | None]:
    """``(True, fn())``, or ``(False, None)`` when ``fn`` ran out of budget (either kind)."""
    status, value = run_with_budget(fn, budget_s, backstop_s)
    return status == FINISHED, value
