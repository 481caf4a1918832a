"""Process pool with per-item timeouts: hung graders score 0 and are replaced; errors are counted."""

import os
import time

import pytest

from deepscaler.rewards import ScorerSpec
from deepscaler.rewards.math_utils.input_guard import GuardLimits
from verl.workers.reward_manager import ScoringPool, scoring_pool

# verify() never returned on this before the input guards; now it is refused as unparseable at once.
TOWER = ("math", "x\n</think>\n\\boxed{9^{9^{9}}}", "1", None)
RIGHT = ("math", "x\n</think>\n\\boxed{\\frac{1}{2}}", "0.5", None)
WRONG = ("math", "x\n</think>\n\\boxed{3}", "0.5", None)
NO_CLOSE = ("math", "\\boxed{3}", "0.5", None)


def raises_value_error(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError("bad row")


def hangs_on_marker_rows(data_source, solution_str, ground_truth, extra_info=None):
    """A user's reward function that never returns on one row: only the pool's kill can end it.
    ``hang`` computes forever (the CPU-time limit ends it), ``sleep`` waits forever (the wall backstop)."""
    if solution_str == "hang":
        while True:
            sum(range(10_000))
    if solution_str == "sleep":
        while True:
            time.sleep(1)
    return 1.0


def dies_on_crash_rows(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "crash":
        os._exit(3)  # a segfault or OOM kill looks the same to the parent: the pipe closes
    return 1.0


@pytest.fixture(scope="module")
def pool():
    with ScoringPool(ScorerSpec(3), num_workers=2, timeout_s=3.0) as p:
        p.wait_ready()
        yield p


def test_scores_and_parse_failures_come_back_in_order(pool):
    results, stats = pool.score([RIGHT, WRONG, NO_CLOSE, RIGHT])
    assert [r.score for r in results] == [1.0, 0.0, 0.0, 1.0]
    assert stats.parse_fail_count == 1 and stats.timeout_count == 0 and stats.error_count == 0


def test_former_hang_is_now_refused_in_process_and_counted_as_unparseable(pool):
    results, stats = pool.score([RIGHT, TOWER, RIGHT])
    assert [r.score for r in results] == [1.0, 0.0, 1.0] and results[1].unparseable
    assert (stats.timeout_count, stats.unparseable_count, stats.worker_restarts) == (0, 1, 0)


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_hung_item_scores_zero_within_the_timeout_and_the_worker_is_replaced():
    with ScoringPool(hangs_on_marker_rows, num_workers=2, timeout_s=3.0) as pool:
        pool.wait_ready()
        pids_before = set(pool.worker_pids())
        ok = ("math", "fine", "1", None)
        # 25 items go out in chunks of 6, so the hung item sits in the middle of a worker's chunk.
        items = [ok] * 12 + [("math", "hang", "1", None)] + [ok] * 12
        start = time.monotonic()
        results, stats = pool.score(items)
        elapsed = time.monotonic() - start
        assert [r.score for r in results] == [1.0] * 12 + [0.0] + [1.0] * 12
        assert stats.timeout_count == 1 and stats.worker_restarts == 1 and stats.wall_timeout_count == 0
        assert elapsed < 3.0 + 60.0  # the timeout plus a generous allowance for a loaded CI machine
        assert len(set(pool.worker_pids()) - pids_before) == 1
        # The replacement worker grades normally.
        results, _ = pool.score([ok, ok])
        assert [r.score for r in results] == [1.0, 1.0]


def test_a_worker_waiting_without_computing_is_ended_by_the_wall_backstop():
    with ScoringPool(hangs_on_marker_rows, num_workers=1, timeout_s=3.0, wall_backstop_s=2.0) as pool:
        items = [("math", "fine", "1", None), ("math", "sleep", "1", None), ("math", "fine", "1", None)]
        results, stats = pool.score(items)
    assert [r.score for r in results] == [1.0, 0.0, 1.0]
    assert (stats.timeout_count, stats.wall_timeout_count, stats.worker_restarts) == (1, 1, 1)


def test_in_process_budget_hits_are_counted_as_timeouts():
    spec = ScorerSpec(3, limits=GuardLimits(time_budget_s=1e-6))
    with ScoringPool(spec, num_workers=1, timeout_s=30.0) as tight:
        results, stats = tight.score([RIGHT, NO_CLOSE])
    assert [(r.score, r.timed_out) for r in results] == [(0.0, True), (0.0, False)]
    assert (stats.timeout_count, stats.worker_restarts) == (1, 0)


@pytest.mark.parametrize("answer", ["9^{9^{9^{9}}}", "{" * 20000 + "1" + "}" * 20000, "1" * 1_000_000])
def test_pathological_inputs_finish_within_the_timeout(pool, answer):
    item = ("math", "x\n</think>\n\\boxed{" + answer + "} " + "y" * 1_000_000, "1", None)
    start = time.monotonic()
    results, _ = pool.score([item])
    assert results[0].score == 0.0
    assert time.monotonic() - start < 3.0 + 60.0


def test_exceptions_are_counted_not_silent():
    with ScoringPool(raises_value_error, num_workers=1, timeout_s=5.0) as p:
        results, stats = p.score([("math", "x", "1", None)] * 2)
    assert [r.score for r in results] == [0.0, 0.0]
    assert stats.error_count == 2 and "ValueError: bad row" in stats.errors[0]


def test_inline_mode_grades_in_the_calling_process():
    with ScoringPool(ScorerSpec(3), num_workers=0) as p:
        results, stats = p.score([RIGHT, WRONG])
    assert [r.score for r in results] == [1.0, 0.0] and stats.worker_restarts == 0


def test_bad_pool_arguments_name_the_key():
    with pytest.raises(ValueError, match="timeout_s"):
        ScoringPool(num_workers=0, timeout_s=0)
    with pytest.raises(ValueError, match="num_workers"):
        ScoringPool(num_workers=-1)
    with pytest.raises(ValueError, match="start_method"):
        ScoringPool(num_workers=0, start_method="thread")


def test_unpicklable_custom_scorer_is_rejected_with_a_clear_error():
    with pytest.raises(ValueError, match="module-level function"):
        ScoringPool(lambda *a: 1.0, num_workers=1)


def test_a_worker_that_dies_mid_item_is_counted_and_replaced():
    with ScoringPool(dies_on_crash_rows, num_workers=1, timeout_s=30.0) as p:
        results, stats = p.score([("math", "ok", "1", None), ("math", "crash", "1", None), ("math", "ok", "1", None)])
    assert [r.score for r in results] == [1.0, 0.0, 1.0]
    assert stats.error_count == 1 and stats.worker_restarts == 1 and stats.timeout_count == 0


def test_a_worker_ready_long_before_the_first_batch_is_not_timed_out():
    """The pool starts with the trainer; the first batch may come minutes later (model load, rollout). A
    READY already in the pipe counts, however old (the recipe rehearsal of train_16k.sh hit this)."""
    with ScoringPool(ScorerSpec(3), num_workers=1, timeout_s=3.0) as p:
        worker = p._workers[0]
        deadline = time.monotonic() + 120
        while not worker.conn.poll() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.started_at -= 2 * scoring_pool.STARTUP_LIMIT_S  # as if it warmed up long ago, unread
        results, _ = p.score([RIGHT])
        assert results[0].score == 1.0 and p.inline_reason is None  # graded by the worker, not the fallback
