"""deadline.call_with_deadline: ends slow Python work in any thread, is not swallowed, leaves nothing behind."""
import threading
import time

from deepscaler.rewards.math_utils.deadline import GradeTimeout, call_with_deadline, check_deadline


def _busy_forever_swallowing_exceptions():
    # Like math-verify and SymPy: broad ``except Exception`` handlers around the slow part.
    while True:
        try:
            sum(range(10_000))
        except Exception:  # noqa: BLE001 - the point of the test
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
    assert (finished, value) == (False, None) and elapsed < 2.0
    start = time.perf_counter()
    assert call_with_deadline(_busy_forever_swallowing_exceptions, 0.2) == (False, None)
    assert time.perf_counter() - start < 2.0


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
    assert time.perf_counter() - start < 2.0

    def spent():
        time.sleep(0.05)
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

    threads = [threading.Thread(target=slow, args=(0,)), threading.Thread(target=fast, args=(1,)),
               threading.Thread(target=slow, args=(2,)), threading.Thread(target=fast, args=(3,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {0: (False, None), 1: (True, 1), 2: (False, None), 3: (True, 3)}
