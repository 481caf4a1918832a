"""Grading of evaluation samples and off-policy traces with the project's graders (deepscaler.rewards).

LUFFY's eval rule (docs/METHOD.md §4.4): when the prompt opened ``<think>\\n`` (or
``--add_think_before_answer``), the graded text is the part after the first ``</think>`` and a response
without one is wrong; ``--no_split_think`` grades the whole response. The answer is then judged by
math-verify, the rule-based grader, or either (``both``/``any``), through ``deepscaler.rewards``.
LUFFY's ``--add_oat_evaluate`` is its own rule (``oat``, ``oat_any`` with ``--any_true``): OAT's boxed
grader (eval_scripts/oat_math_grader.py) on the text after ``</think>``, or on the whole response when
``</think>`` is missing -- more lenient than ``both``, which counts such a response wrong.
Every call runs under a CPU-time limit (SIGPROF in the grading process's main thread, with a generous
wall-clock SIGALRM backstop reported as ``wall_timeout``; the scorers
run math-verify with its own timers off) and timeouts / grader errors are counted, never silently
folded into "wrong". The trainer's ``ScoringPool`` is not used here: a script is single-threaded, so
the alarm works, and that pool's workers re-import the calling script (~8 s each on a busy 2-core box).
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from typing import Callable, Iterable, Optional, Sequence

from deepscaler.rewards import grade_solution
from deepscaler.rewards.math_utils.input_guard import active_limits
from verl.utils.dataset.value_checks import ground_truth_problem

THINK_OPEN = "<think>\n"
THINK_CLOSE = "</think>"
# ``both`` is this project's CLI name, ``any`` the scorer's; they mean the same. ``oat`` / ``oat_any`` are
# LUFFY's ``--add_oat_evaluate`` (``--any_true``) rules.
GRADERS = ("math_verify", "rule", "both", "any", "oat", "oat_any")
OAT_GRADERS = ("oat", "oat_any")
# What each grader name means, as the outputs and collect_results report it.
RULES = {
    "math_verify": "math-verify on the text after </think> (missing </think>: wrong)",
    "rule": "rule grader on the text after </think> (missing </think>: wrong)",
    "both": "math-verify OR rule grader on the text after </think> (missing </think>: wrong; stricter than LUFFY's OAT)",
    "any": "math-verify OR rule grader on the text after </think> (missing </think>: wrong; stricter than LUFFY's OAT)",
    "oat": "LUFFY --add_oat_evaluate: OAT boxed grader on the text after </think>, the whole text when it is missing",
    "oat_any": "LUFFY --add_oat_evaluate --any_true: math-verify after </think> OR the OAT boxed grader (whole text when "
    "</think> is missing)",
}
DEFAULT_TIMEOUT_S = 10.0  # LUFFY's math-verify SIGALRM limit


@dataclasses.dataclass(frozen=True)
class GradeResult:
    correct: bool
    status: str  # ok | no_answer | no_think_close | unparseable | timeout | error | bad_ground_truth
    answer: Optional[str] = None


def scorer_grader_name(grader: str) -> str:
    if grader not in GRADERS:
        raise ValueError(f"unknown grader {grader!r}; valid: {', '.join(GRADERS)}")
    return "any" if grader == "both" else grader


def _grade_oat(text: str, ground_truth, grader: str, split_think: bool, timeout_s: Optional[float]) -> GradeResult:
    """LUFFY's --add_oat_evaluate: the OAT boxed grader on the answer region, or on the whole response when
    ``</think>`` is missing (LUFFY's split raises there and keeps the whole text); with ``oat_any`` a
    math-verify label on the region (False when there is none) is OR-ed in."""
    from eval_scripts.oat_math_grader import boxed_reward_fn, extract_answer

    region = answer_region(text, split_think)
    graded = text if region is None else region

    def label() -> bool:
        info, reward = boxed_reward_fn(graded, ground_truth, fast=False)
        if info.get("timed_out"):
            raise _Timeout()
        oat = reward == 1.0
        if grader == "oat_any" and not oat and region is not None:
            return grade_solution(region, ground_truth, "math_verify").correct
        return oat

    try:
        correct = bool(_with_timeout(label, timeout_s))
    except _Timeout:
        return GradeResult(False, "timeout")
    except Exception as err:  # counted and reported, as for the other graders
        return GradeResult(False, f"error: {type(err).__name__}")
    answer = extract_answer(graded)
    status = "whole_text" if region is None else ("ok" if answer is not None or correct else "no_answer")
    return GradeResult(correct, status, answer)


def should_split_think(prompt: str, add_think_before_answer: bool = False, no_split_think: bool = False) -> bool:
    """LUFFY's ``think_format``: the prompt opened a think block (or we are told to assume it)."""
    return (prompt.endswith(THINK_OPEN) or add_think_before_answer) and not no_split_think


def answer_region(text: str, split_think: bool) -> Optional[str]:
    """The text to grade: between the first and second ``</think>`` when splitting, None if none."""
    if not split_think:
        return text
    parts = text.split(THINK_CLOSE)
    return parts[1] if len(parts) > 1 else None


class _Timeout(BaseException):
    """SIGALRM's exception: a BaseException, so math-verify's ``except Exception`` cannot swallow it."""


class _WallTimeout(_Timeout):
    """The wall-clock backstop fired: the grader waited far longer than its CPU limit without computing."""


def _on_alarm(signum, frame):
    raise _WallTimeout() if signum == signal.SIGALRM else _Timeout()


def _with_timeout(fn: Callable, timeout_s: Optional[float]):
    """Run ``fn()`` with a limit of ``timeout_s`` seconds of this process's CPU time (SIGPROF; a busy
    machine slows grading down but never turns a verdict into a timeout) when we are a POSIX main
    thread (no limit otherwise)."""
    usable = timeout_s and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        return fn()
    from deepscaler.rewards.math_utils.deadline import default_backstop_s

    # Someone else's timers (a job's own alarm, pytest-timeout's) are re-armed afterwards with what is left
    # of them, so grading never silently cancels an outer limit.
    outer = {which: signal.getitimer(which) for which in (signal.ITIMER_PROF, signal.ITIMER_REAL)}
    previous = signal.signal(signal.SIGPROF, _on_alarm), signal.signal(signal.SIGALRM, _on_alarm)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_PROF, timeout_s)
    signal.setitimer(signal.ITIMER_REAL, default_backstop_s(timeout_s))
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, previous[0])
        signal.signal(signal.SIGALRM, previous[1])
        spent = time.monotonic() - started  # an upper bound of the CPU time spent too
        for which, (left, interval) in outer.items():
            if left > 0:
                signal.setitimer(which, max(1e-3, left - spent), interval)


def grade_text(
    text: str, ground_truth, grader: str, split_think: bool, timeout_s: Optional[float] = DEFAULT_TIMEOUT_S
) -> GradeResult:
    """Grade one response (or trace) against its ground truth."""
    if ground_truth_problem(ground_truth) is not None:
        # Every grader, OAT included: a NaN/inf/empty/dict reference is broken data; ``\boxed{nan}`` must not
        # match ``nan``. Guarded here, at the one call site, so the graders' internals stay untouched.
        return GradeResult(False, "bad_ground_truth")
    if grader in OAT_GRADERS:
        return _grade_oat(text, ground_truth, grader, split_think, timeout_s)
    region = answer_region(text, split_think)
    if region is None:
        return GradeResult(False, "no_think_close")
    name = scorer_grader_name(grader)
    # The graders bound themselves in any thread (GuardLimits.time_budget_s, at most timeout_s); the
    # alarm stays as the outer limit of the main thread.
    limits = active_limits()
    if timeout_s:
        limits = dataclasses.replace(limits, time_budget_s=min(float(timeout_s), limits.time_budget_s))
    try:
        result = _with_timeout(lambda: grade_solution(region, ground_truth, name, limits=limits), timeout_s)
    except _WallTimeout:
        return GradeResult(False, "wall_timeout")
    except _Timeout:
        return GradeResult(False, "timeout")
    except Exception as err:  # a grader bug must not end a long eval; it is counted and reported
        return GradeResult(False, f"error: {type(err).__name__}")
    if result.timed_out:
        return GradeResult(False, "wall_timeout" if result.wall_timed_out else "timeout")
    if result.unparseable:
        return GradeResult(False, "unparseable", result.answer)
    status = "no_answer" if result.parse_failed and not result.correct else "ok"
    return GradeResult(bool(result.correct), status, result.answer)


def _grade_task(task: tuple) -> GradeResult:
    text, ground_truth, grader, split_think, timeout_s = task
    return grade_text(text, ground_truth, grader, split_think, timeout_s)


def grade_many(
    tasks: Sequence[tuple], workers: int = 1, progress_bar: Optional[Callable[[Iterable, int], Iterable]] = None
) -> list[GradeResult]:
    """Grade ``(text, ground_truth, grader, split_think, timeout_s)`` tasks, in ``workers`` processes if > 1.

    Worker processes are spawned (not forked): the caller may hold an inference engine's threads.
    """
    from deepscaler.rewards.bounded import warm_graders

    wrap = progress_bar or (lambda it, total: it)
    if workers <= 1 or len(tasks) < 2 * workers:
        warm_graders()  # outside every item's limit: the first grade costs what later ones cost
        return [_grade_task(t) for t in wrap(tasks, len(tasks))]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    chunk = max(1, min(64, len(tasks) // (8 * workers)))
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=warm_graders
    ) as pool:
        return list(wrap(pool.map(_grade_task, tasks, chunksize=chunk), len(tasks)))


def grade_samples(
    samples: Sequence[dict],
    grader: str,
    add_think_before_answer: bool = False,
    no_split_think: bool = False,
    workers: int = 1,
    timeout_s: Optional[float] = DEFAULT_TIMEOUT_S,
    progress_bar: Optional[Callable[[Iterable, int], Iterable]] = None,
) -> list[GradeResult]:
    """Grade generate_vllm samples (``prompt``, ``generated_text``, ``ground_truth``) by LUFFY's eval rule."""
    scorer_grader_name(grader)  # fail before any work on a bad name
    tasks = [
        (
            s["generated_text"],
            s["ground_truth"],
            grader,
            should_split_think(s["prompt"], add_think_before_answer, no_split_think),
            timeout_s,
        )
        for s in samples
    ]
    return grade_many(tasks, workers, progress_bar)
