"""eval_scripts/grading.py: LUFFY's think split, grader selection, counted timeouts and errors."""

from __future__ import annotations

import time

import pytest

import eval_scripts.grading as grading
from eval_scripts.grading import answer_region, grade_many, grade_samples, grade_text, should_split_think


def test_think_split_follows_luffy():
    assert should_split_think("<|im_start|>assistant\n<think>\n")
    assert not should_split_think("<|im_start|>assistant\n")
    assert should_split_think("assistant\n", add_think_before_answer=True)
    assert not should_split_think("<think>\n", no_split_think=True)
    assert answer_region("a</think>b</think>c", True) == "b"  # between the first and second </think>
    assert answer_region("no close tag \\boxed{1}", True) is None
    assert answer_region("whole", False) == "whole"


@pytest.mark.parametrize("grader", ["math_verify", "rule", "both"])
def test_graders_agree_on_clear_cases(grader):
    assert grade_text("x</think>\nThe answer is \\boxed{\\frac{1}{2}}.", "0.5", grader, True).correct
    assert not grade_text("x</think>\n\\boxed{3}", "4", grader, True).correct
    missing = grade_text("\\boxed{4} but the think block never closes", "4", grader, True)
    assert (missing.correct, missing.status) == (False, "no_think_close")


def test_unknown_grader_is_rejected():
    with pytest.raises(ValueError, match="unknown grader"):
        grade_samples([], "oat_v2")


def test_slow_grader_times_out_and_is_counted(monkeypatch):
    def slow(*args, **kwargs):
        end = time.process_time() + 5
        while time.process_time() < end:
            pass

    monkeypatch.setattr(grading, "grade_solution", slow)
    t0 = time.process_time()
    result = grade_text("</think>\\boxed{1}", "1", "rule", True, timeout_s=0.2)
    assert (result.correct, result.status) == (False, "timeout") and time.process_time() - t0 < 3


def _sleeps_then_correct(*args, **kwargs):
    from deepscaler.rewards.reward_types import ScoreResult

    time.sleep(0.5)
    return ScoreResult(1.0, True)


def test_the_eval_limit_is_cpu_time_and_a_waiting_grader_meets_the_wall_backstop(monkeypatch):
    from deepscaler.rewards.math_utils import deadline

    monkeypatch.setattr(grading, "grade_solution", _sleeps_then_correct)
    # 0.5 s of waiting costs no CPU: a 0.2 s limit is not spent (a busy machine's queueing is not either).
    assert grade_text("</think>\\boxed{1}", "1", "rule", True, timeout_s=0.2).status == "ok"
    monkeypatch.setattr(deadline, "default_backstop_s", lambda budget: 0.3)
    result = grade_text("</think>\\boxed{1}", "1", "rule", True, timeout_s=0.2)
    assert (result.correct, result.status) == (False, "wall_timeout")


def test_grader_exception_is_counted_not_hidden(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(grading, "grade_solution", broken)
    assert grade_text("</think>\\boxed{1}", "1", "rule", True).status == "error: RuntimeError"


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_process_pool_gives_the_same_grades_as_in_process():
    tasks = [(f"</think>\\boxed{{{i % 3}}}", "1", "rule", True, 10.0) for i in range(12)]
    serial = grade_many(tasks, workers=1)
    assert [g.correct for g in serial] == [i % 3 == 1 for i in range(12)]
    assert grade_many(tasks, workers=2) == serial


def test_alarm_is_not_swallowed_by_broad_exception_handlers(monkeypatch):
    # math-verify wraps parsing and comparison in ``except Exception``; the alarm must get through.
    def swallowing(*args, **kwargs):
        end = time.process_time() + 5
        while time.process_time() < end:
            try:
                sum(range(1000))
            except Exception:  # noqa: BLE001 - what math-verify does
                pass
        raise AssertionError("the alarm was swallowed")

    monkeypatch.setattr(grading, "grade_solution", swallowing)
    t0 = time.process_time()
    result = grade_text("</think>\\boxed{1}", "1", "math_verify", True, timeout_s=0.3)
    assert (result.correct, result.status) == (False, "timeout") and time.process_time() - t0 < 3


def test_budget_hit_off_the_main_thread_is_reported_as_timeout():
    import threading

    box = {}
    thread = threading.Thread(
        target=lambda: box.update(r=grade_text("</think>\\boxed{\\frac{1}{2}}", "0.5", "both", True, timeout_s=1e-6))
    )
    thread.start()
    thread.join(30)
    assert box["r"].status == "timeout" and not box["r"].correct
    assert grade_text("</think>\\boxed{\\frac{1}{2}}", "0.5", "both", True).status == "ok"


def test_input_beyond_the_guard_limits_is_reported_as_unparseable():
    for grader in ("math_verify", "rule", "both"):
        result = grade_text("</think>\\boxed{9^{9^{9^{9^{9}}}}}", "1", grader, True)
        assert (result.correct, result.status) == (False, "unparseable")


@pytest.mark.parametrize("grader", ["math_verify", "rule", "both", "oat", "oat_any"])
@pytest.mark.parametrize("ground_truth", ["nan", float("nan"), "inf", "-Infinity", "", {"answer": "3"}])
def test_unusable_ground_truth_is_never_correct(grader, ground_truth):
    # G8: OAT's grader called \boxed{nan} correct against nan; every grader now refuses such a reference.
    answer = "nan" if not isinstance(ground_truth, dict) and "inf" not in str(ground_truth).lower() else "\\infty"
    result = grade_text(f"x</think>\\boxed{{{answer}}}", ground_truth, grader, True)
    assert not result.correct and result.status == "bad_ground_truth"


def test_grading_re_arms_an_outer_alarm_instead_of_cancelling_it():
    """A job's own SIGALRM limit (pytest-timeout's, a batch script's) survives an eval grade: it is re-armed
    with what is left of it, not cleared."""
    import signal

    signal.setitimer(signal.ITIMER_REAL, 50.0)
    try:
        assert grade_text("\\boxed{4}", "4", "math_verify", split_think=False, timeout_s=5.0).correct
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 40.0 < left <= 50.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
