"""deadline.run_with_budget: ends slow Python work in any thread by its CPU time (a wall-clock backstop as its
own status), is not swallowed, leaves nothing behind."""

import threading
import time

from deepscaler.rewards.math_utils.deadline import (
    CPU_TIMEOUT,
    FINISHED,
    WALL_TIMEOUT,
    GradeTimeout,
    GradeWallTimeout,
    call_with_deadline,
    check_deadline,
    default_backstop_s,
    run_with_budget,
)


def _busy_forever_swallowing_exceptions():
    # Like math-verify and SymPy: broad ``except Exception`` handlers around the slow part.
    while True:
        try:
            sum(range(10_000))
        except Exception:  # noqa: BLE001 - the point of the test
            pass


def _spin_cpu(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _in_thread(fn):
    box = {}

    def target():
        start = time.perf_counter()
        box["value"] = fn()
        box["elapsed"] = time.perf_counter() - start

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    return box["value"], box["elapsed"]


def test_slow_python_is_ended_in_a_worker_thread_and_in_the_main_thread():
    (finished, value), elapsed = _in_thread(lambda: call_with_deadline(_busy_forever_swallowing_exceptions, 0.2))
    assert (finished, value) == (False, None) and elapsed < 20.0  # 0.2 CPU s; wall grows with load
    start = time.perf_counter()
    assert call_with_deadline(_busy_forever_swallowing_exceptions, 0.2) == (False, None)
    assert time.perf_counter() - start < 20.0


def test_fast_calls_return_their_value_and_no_late_exception_arrives():
    for i in range(200):
        assert call_with_deadline(lambda: i * 2, 0.05) == (True, i * 2)
    time.sleep(0.2)  # a watchdog that fired late would raise GradeTimeout here
    assert issubclass(GradeTimeout, BaseException) and not issubclass(GradeTimeout, Exception)


def test_nested_calls_share_the_outer_budget_and_cooperative_check_raises():
    def inner():
        return call_with_deadline(_busy_forever_swallowing_exceptions, 100.0)

    start = time.perf_counter()
    assert call_with_deadline(inner, 0.2) == (False, None)
    assert time.perf_counter() - start < 20.0

    def spent():
        _spin_cpu(0.05)
        check_deadline()
        return "not reached"

    assert call_with_deadline(spent, 0.01) == (False, None)
    check_deadline()  # outside a budget: no-op


def test_concurrent_threads_have_independent_budgets():
    results = {}

    def slow(k):
        results[k] = call_with_deadline(_busy_forever_swallowing_exceptions, 0.3)

    def fast(k):
        results[k] = call_with_deadline(lambda: time.sleep(0.05) or k, 5.0)

    threads = [
        threading.Thread(target=slow, args=(0,)),
        threading.Thread(target=fast, args=(1,)),
        threading.Thread(target=slow, args=(2,)),
        threading.Thread(target=fast, args=(3,)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {0: (False, None), 1: (True, 1), 2: (False, None), 3: (True, 3)}


def test_the_budget_is_cpu_time_so_waiting_does_not_spend_it():
    # 0.4 s of sleeping costs no CPU: a 0.1 s budget is not spent, the way a busy machine's queueing is not.
    assert run_with_budget(lambda: time.sleep(0.4) or "done", 0.1, backstop_s=30.0) == (FINISHED, "done")
    assert run_with_budget(lambda: _spin_cpu(5.0), 0.1, backstop_s=30.0) == (CPU_TIMEOUT, None)


def test_the_wall_clock_backstop_is_its_own_status():
    start = time.perf_counter()

    def waits_forever():
        while True:
            time.sleep(0.01)

    assert run_with_budget(waits_forever, 5.0, backstop_s=0.3) == (WALL_TIMEOUT, None)
    assert time.perf_counter() - start < 20.0
    assert issubclass(GradeWallTimeout, GradeTimeout)
    assert default_backstop_s(3.0) == 60.0 and default_backstop_s(10.0) == 200.0
    time.sleep(0.1)  # no late exception


def test_a_dropped_timeout_is_raised_again_until_the_thread_stops():
    # CPython prints and drops an async exception that lands in a __del__ or weakref callback (SymPy's caches
    # run them constantly); here the first GradeTimeout is swallowed on purpose. Fired once, the thread would
    # compute forever; the watchdog must raise again while the thread stays armed and keeps computing.
    swallowed = []

    def drop_the_first_timeout():
        while True:
            try:
                sum(range(10_000))
            except GradeTimeout:
                if swallowed:
                    raise
                swallowed.append(time.thread_time())

    (status, value), elapsed = _in_thread(lambda: run_with_budget(drop_the_first_timeout, 0.05))
    assert (status, value) == (CPU_TIMEOUT, None)
    assert len(swallowed) == 1  # the first one really was dropped, and a second one ended the call
    assert elapsed < 5.0


def test_no_second_timeout_reaches_the_caller_after_a_timed_out_call():
    # The re-fire stops with the disarm: a caller that goes on computing after a timeout is never interrupted.
    def spin():
        _spin_cpu(10)

    status, _ = run_with_budget(spin, 0.05)
    assert status == CPU_TIMEOUT
    _spin_cpu(0.3)  # several re-fire periods: a late exception would raise here
    assert run_with_budget(lambda: 7, 1.0) == (FINISHED, 7)


def test_a_timeout_that_lands_while_the_call_disarms_never_leaves_the_watchdog_locked():
    """Budgets so small that the watchdog fires while the call is finishing and disarming: under load a
    timeout once landed right after disarm acquired the watchdog's lock, and every later grade in that
    process hung. Every call must still return, with either status, and leave nothing pending."""
    from deepscaler.rewards.math_utils import deadline

    def hammer(box, i):
        statuses = set()
        for k in range(400):
            # from nothing to ~10 ms of work: some calls end before the watchdog looks, some are timed out (the
            # longest always, even on a machine busy enough to delay the watchdog's thread)
            status, value = deadline.run_with_budget(lambda: sum(range((k % 5) ** 3 * 4000)), 1e-6)
            assert status in (FINISHED, CPU_TIMEOUT) and (value is None) == (status == CPU_TIMEOUT)
            statuses.add(status)
        box[i] = statuses

    box = {}
    threads = [threading.Thread(target=hammer, args=(box, i), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a call hung: the watchdog's lock was left taken"
    assert len(box) == 4 and CPU_TIMEOUT in set().union(*box.values())
    assert not deadline._WATCHDOG._armed  # every call disarmed
    assert call_with_deadline(lambda: 7, 1.0) == (True, 7)  # and the next grade runs normally
    time.sleep(0.1)  # no late exception arrives after the calls returned
