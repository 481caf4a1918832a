"""A busy machine never changes a reward: graders and the scoring pool next to CPU-bound neighbours give the
same verdicts as on a quiet machine, with no timeout and no failure; workers that cannot start make the
pool grade in-process with one warning instead of ending the run.

The neighbours are 6 busy-loop processes started by this module, each ending itself after at most
``NEIGHBOUR_LIFETIME_S`` and killed by pid when each test finishes.
"""

import json
import logging
import subprocess
import sys
import textwrap
import time

import pytest

from deepscaler.rewards import ScorerSpec
from verl.workers.reward_manager import ScoringPool
from verl.workers.reward_manager import scoring_pool as scoring_pool_module

NEIGHBOURS = 6
NEIGHBOUR_LIFETIME_S = 900  # a bound in case this process dies without its teardown

# (response, ground truth, correct?) - LaTeX, plain numbers, wrong answers, a missing </think>.
CASES = [
    ("x\n</think>\nThe answer is $\\boxed{\\frac{3}{4}}$.", "0.75", True),
    ("x\n</think>\n$\\boxed{2\\sqrt{3}}$", "\\sqrt{12}", True),
    ("x\n</think>\n\\boxed{\\dfrac{\\pi}{6}}", "\\frac{\\pi}{6}", True),
    ("x\n</think>\nSo we get \\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("x\n</think>\n\\boxed{41}", "42", False),
    ("x\n</think>\n\\boxed{\\frac{1}{3}}", "0.5", False),
    ("\\boxed{3}", "3", False),
]

# A cold process: the first grade of each case is the process's first call of that parser path. The
# budget (1 CPU-second) is below what a cold first grade used to take in *wall* time on a loaded machine.
COLD_SCRIPT = textwrap.dedent("""
    import json, sys
    from deepscaler.rewards.math_utils.input_guard import GuardLimits
    from deepscaler.rewards.selection import score_response
    cases = json.loads(sys.argv[1])
    limits = GuardLimits(time_budget_s=1.0)
    out = []
    for _round in range(2):
        for text, truth, _ in cases:
            r = score_response("aime", text, truth, reward_impl_version=3, grader="math_verify", limits=limits)
            out.append([r.correct, r.timed_out, r.wall_timed_out])
    print(json.dumps(out))
""")


@pytest.fixture
def busy_neighbours():
    code = f"import time\nend = time.monotonic() + {NEIGHBOUR_LIFETIME_S}\nwhile time.monotonic() < end:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(NEIGHBOURS)]
    try:
        time.sleep(0.5)
        assert all(p.poll() is None for p in procs), "a busy neighbour did not start"
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)


def _items():
    return [("aime", text, truth, None) for text, truth, _ in CASES]


@pytest.mark.slow
def test_cold_process_grades_identically_next_to_busy_neighbours(busy_neighbours):
    proc = subprocess.run(
        [sys.executable, "-c", COLD_SCRIPT, json.dumps(CASES)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = [[correct, False, False] for _t, _g, correct in CASES] * 2
    assert verdicts == expected
    assert all(p.poll() is None for p in busy_neighbours)  # the load was there all along


@pytest.mark.slow
def test_pool_verdicts_next_to_busy_neighbours_match_inline_grading(busy_neighbours):
    with ScoringPool(ScorerSpec(3), num_workers=0) as inline:
        quiet, _ = inline.score(_items() * 2)
    assert [r.correct for r in quiet] == [c for _t, _g, c in CASES] * 2
    # A 2 s per-item limit is generous in CPU time and tight in wall time for this much load.
    with ScoringPool(ScorerSpec(3), num_workers=2, timeout_s=2.0) as pool:
        for _ in range(2):
            results, stats = pool.score(_items() * 2)
            assert [(r.score, r.correct) for r in results] == [(r.score, r.correct) for r in quiet]
            assert (stats.timeout_count, stats.wall_timeout_count, stats.error_count) == (0, 0, 0)
        assert pool.inline_reason is None
    assert all(p.poll() is None for p in busy_neighbours)


class NeverStarts(ScorerSpec):
    """A scorer whose worker warm-up fails (as an import error in the worker would)."""

    def warm_up(self) -> None:
        raise ImportError("no module named 'broken_grader_dependency'")


class StallsAtStart(ScorerSpec):
    """A scorer whose worker warm-up waits forever without computing (a hung start-up)."""

    def warm_up(self) -> None:
        while True:
            time.sleep(1)


@pytest.mark.slow  # waits for worker start-ups on purpose (seconds each)
def test_workers_that_cannot_start_make_the_pool_grade_in_process_with_one_warning(caplog):
    caplog.set_level(logging.WARNING, logger=scoring_pool_module.__name__)
    with ScoringPool(NeverStarts(3), num_workers=2, timeout_s=5.0) as pool:
        results, stats = pool.score(_items())
        again, _ = pool.score(_items())
        assert "broken_grader_dependency" in (pool.inline_reason or "")
    assert [r.correct for r in results] == [c for _t, _g, c in CASES] == [r.correct for r in again]
    assert stats.error_count == 0 and stats.timeout_count == 0
    fallback_lines = [r for r in caplog.records if "grading in the trainer's process" in r.getMessage()]
    assert len(fallback_lines) == 1


@pytest.mark.slow  # waits for worker start-ups on purpose (seconds each)
def test_a_start_up_without_progress_is_given_up_and_grading_goes_on(monkeypatch, caplog):
    monkeypatch.setattr(scoring_pool_module, "STARTUP_STALL_S", 1.5)
    caplog.set_level(logging.WARNING, logger=scoring_pool_module.__name__)
    with ScoringPool(StallsAtStart(3), num_workers=1, timeout_s=5.0) as pool:
        results, stats = pool.score(_items())
        assert "no CPU progress" in (pool.inline_reason or "")
    assert [r.correct for r in results] == [c for _t, _g, c in CASES]
    assert stats.error_count == 0


@pytest.mark.slow  # waits for worker start-ups on purpose (seconds each)
def test_a_slow_but_computing_start_up_is_waited_for(monkeypatch):
    # The stall limit only ends start-ups that stopped computing; this one computes for ~1.5 s with a 1 s limit.
    monkeypatch.setattr(scoring_pool_module, "STARTUP_STALL_S", 1.0)
    with ScoringPool(ComputesAtStart(3), num_workers=1, timeout_s=5.0, start_method="fork") as pool:
        assert pool.wait_ready() is True
        results, _ = pool.score(_items()[:2])
        assert pool.inline_reason is None
    assert [r.correct for r in results] == [True, True]


class ComputesAtStart(ScorerSpec):
    def warm_up(self) -> None:
        end = time.process_time() + 1.5
        while time.process_time() < end:
            pass
        super().warm_up()


def dies_on_crash_rows(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "crash":
        import os

        os._exit(3)
    return 1.0


def test_no_replacement_worker_means_in_process_grading_not_a_failed_run(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=scoring_pool_module.__name__)
    with ScoringPool(dies_on_crash_rows, num_workers=1, timeout_s=5.0) as pool:
        assert pool.wait_ready() is True

        def no_more_processes(*args, **kwargs):
            raise OSError(11, "Resource temporarily unavailable")

        monkeypatch.setattr(scoring_pool_module, "_Worker", no_more_processes)
        ok = ("math", "fine", "1", None)
        results, stats = pool.score([ok, ("math", "crash", "1", None), ok, ok])
        assert [r.score for r in results] == [1.0, 0.0, 1.0, 1.0] and stats.error_count == 1
        assert "cannot start a replacement worker" in (pool.inline_reason or "")
        results, _ = pool.score([ok])
        assert results[0].score == 1.0
