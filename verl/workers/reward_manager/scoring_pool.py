"""Persistent process pool that grades responses with a per-item CPU-time timeout enforced by us.

Math-verify and SymPy can run for hours on adversarial answers, and math-verify's own SIGALRM timeout
fails off the main thread (threaded Ray actors, async code). So each worker process owns one pipe; the
parent hands a short chunk of items to each idle worker, the worker answers item by item, and every
answer restarts that worker's budget for its next item. The budget is the worker *process's CPU time*
(``timeout_s``), so a loaded machine slows grading down without changing a verdict; a generous
wall-clock backstop (``wall_backstop_s``) catches a worker that hangs without computing (a custom
function blocked on I/O). A worker past either is killed (SIGKILL) and replaced; the item it was on
scores 0 and counts as a timeout (a backstop kill also as ``wall_timeout_count``), the rest of its chunk
is re-queued.

Start-up: the pool waits for a starting worker as long as it makes progress (its CPU time grows), so a
busy machine never ends a run. A worker that exits three times during start-up, or stalls (no CPU for
``STARTUP_STALL_S``), or is still not ready after ``STARTUP_LIMIT_S``, is given up; when no worker is
left the pool grades in the calling process (the built-in graders bound themselves in CPU time) and
logs one warning saying why.

Start method: ``forkserver`` by default. ``fork`` copies a parent that may hold other threads' locks
(Ray's gRPC threads, tokenizer pools, vLLM), which can deadlock the child; ``spawn`` is safe but
re-imports everything per worker (~1.5 s). The fork server is a clean single-threaded process started
once, with the grading modules preloaded, and forks warm workers in milliseconds, including the
replacements after a timeout.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
from multiprocessing.connection import wait as wait_for_ready
from typing import Callable, Sequence

from deepscaler.rewards.math_utils.deadline import default_backstop_s
from deepscaler.rewards.reward_types import ScoreResult
from deepscaler.rewards.selection import ScorerSpec

logger = logging.getLogger(__name__)

START_METHODS = ("forkserver", "spawn", "fork")
# Most items sent to a worker in one message (each still has its own deadline).
MAX_CHUNK = 8
PRELOAD_MODULES = ["deepscaler.rewards", "math_verify", "latex2sympy2_extended", "sympy"]

# One item = (data_source, solution_str, ground_truth, extra_info).
ScoreItem = tuple
# A starting worker that gains no CPU time for this long is stuck (imports always compute).
STARTUP_STALL_S = 120.0
# Outer limit of one worker's start-up even while it computes (a warm-up that loops).
STARTUP_LIMIT_S = 1800.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
    except (OSError, IndexError, ValueError):
        pass
    try:
        import psutil

        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    except Exception:  # noqa: BLE001 - gone, or no psutil: the caller falls back to wall time
        return None


@dataclasses.dataclass
class PoolStats:
    """Counters for one ``score`` call (the reward manager turns them into ``reward/*`` metrics)."""

    timeout_count: int = 0  # items killed at the pool's deadline plus items whose scorer hit its time budget
    wall_timeout_count: int = 0  # of those, items stopped by a wall-clock backstop (pool kill or in-process)
    error_count: int = 0
    parse_fail_count: int = 0
    unparseable_count: int = 0  # items an input guard refused (also counted in parse_fail_count)
    worker_restarts: int = 0
    score_time_s: float = 0.0
    errors: list[str] = dataclasses.field(default_factory=list)


class CallableScorer:
    """Adapts a verl-style ``compute_score(ds, text, gt, extra) -> float`` to the worker protocol.

    The function must be importable by name (a module-level function) when the start method is
    ``spawn`` or ``forkserver``: it is pickled by reference.
    """

    def __init__(self, fn: Callable[..., float]):
        self.fn = fn

    def warm_up(self) -> None:
        """Nothing to warm: a custom function's cost is its own."""

    def score(self, data_source, solution_str, ground_truth, extra_info=None) -> ScoreResult:
        value = self.fn(data_source, solution_str, ground_truth, extra_info)
        if isinstance(value, ScoreResult):
            return value
        value = float(value)
        return ScoreResult(value, value > 0.0)


READY = -1


def _worker_main(conn, scorer) -> None:
    """Worker loop: warm up, announce ``(READY, ok, info)``, then for each message (a list of
    ``(task_id, item)``) reply ``(task_id, ok, payload)`` per item, in order; ``None`` stops it."""
    # Ctrl-C goes to the whole process group; the parent decides what happens to workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # First calls compile math-verify's regexes and build the LaTeX parser (~0.5 s); doing it here
        # keeps that cost out of the first item's deadline.
        warm_up = getattr(scorer, "warm_up", None)
        if warm_up is not None:
            warm_up()
        conn.send((READY, True, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        try:
            conn.send((READY, False, f"{type(exc).__name__}: {str(exc)[:300]}"))
        finally:
            return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # parent is gone
        if message is None:
            return
        for task_id, item in message:
            try:
                result = scorer.score(*item)
                reply = (
                    task_id,
                    True,
                    (
                        float(result.score),
                        bool(result.correct),
                        bool(result.parse_failed),
                        result.answer,
                        bool(result.unparseable),
                        bool(result.timed_out),
                        bool(result.wall_timed_out),
                    ),
                )
            except BaseException as exc:  # noqa: BLE001 - reported to the parent and counted as an error
                reply = (task_id, False, f"{type(exc).__name__}: {str(exc)[:300]}")
            try:
                conn.send(reply)
            except (BrokenPipeError, OSError):
                return


class _Worker:
    def __init__(self, ctx, scorer):
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child_conn, scorer), daemon=True, name="reward-scorer")
        self.process.start()
        child_conn.close()
        self.tasks: collections.deque[int] = collections.deque()  # sent, not yet answered, in order
        self.cpu_start = 0.0  # process CPU seconds when the current item's budget started
        self.wall_deadline = 0.0
        self.ready = False
        self.started_at = time.monotonic()
        self.last_cpu = 0.0  # start-up progress: CPU seconds seen last, and when they last grew
        self.last_progress = self.started_at

    def cpu_s(self) -> float | None:
        return process_cpu_s(self.process.pid) if self.process.pid is not None else None

    def start_item(self, backstop_s: float) -> None:
        cpu = self.cpu_s()
        self.cpu_start = cpu if cpu is not None else -1.0
        self.item_started = time.monotonic()
        self.wall_deadline = self.item_started + backstop_s

    def cpu_left(self, timeout_s: float) -> float:
        """CPU seconds left for the current item (wall time where the CPU clock is unreadable)."""
        cpu = self.cpu_s()
        if cpu is None or self.cpu_start < 0:
            return timeout_s - (time.monotonic() - self.item_started)
        return timeout_s - (cpu - self.cpu_start)

    def startup_stalled(self, now: float) -> bool:
        """Record start-up progress; True when the process gained no CPU time for ``STARTUP_STALL_S``."""
        cpu = self.cpu_s()
        if cpu is not None and cpu > self.last_cpu:
            self.last_cpu, self.last_progress = cpu, now
        return now - self.last_progress > STARTUP_STALL_S

    def kill(self) -> None:
        try:
            self.process.kill()
        except (OSError, AttributeError):
            pass
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()


class ScoringPool:
    """Grades items in ``num_workers`` persistent processes with a per-item timeout.

    Args:
        scorer: a ``ScorerSpec`` (built-in scorers) or a module-level ``compute_score`` function.
        num_workers: worker processes; 0 grades inline in the calling process (no pool timeout: the
            built-in graders bound themselves; for debugging and the benchmark's baseline).
        timeout_s: CPU-time limit per item (the worker process's CPU seconds), counted from the moment
            the worker can start it (its chunk was sent, or the worker answered the previous item).
        start_method: ``forkserver`` (default), ``spawn`` or ``fork`` (see the module docstring).
        wall_backstop_s: wall-clock limit per item for a worker that hangs without computing (default
            ``max(60, 20 x timeout_s)``: it must never fire on a busy machine).

    ``score`` may be called from any thread, one call at a time (a lock serialises calls). Workers warm
    up (imports, first parse) before they take items, so start-up time never counts against an item.
    ``inline_reason`` is set (and one warning logged) when the workers could not start and the pool
    grades in the calling process.
    """

    def __init__(
        self,
        scorer: ScorerSpec | Callable[..., float] | None = None,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        start_method: str = "forkserver",
        wall_backstop_s: float | None = None,
    ):
        if num_workers < 0:
            raise ValueError(f"reward.num_workers must be >= 0, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {timeout_s}")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
        scorer = ScorerSpec() if scorer is None else scorer
        self.scorer = scorer if isinstance(scorer, ScorerSpec) else CallableScorer(scorer)
        if num_workers > 0 and start_method != "fork":
            try:
                pickle.dumps(self.scorer)
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                raise ValueError(
                    "a custom compute_score must be a module-level function (it is sent to "
                    f"worker processes by name) when num_workers > 0: {exc}"
                ) from exc
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._closed = False
        self._start_failures = 0
        self.wall_backstop_s = default_backstop_s(self.timeout_s) if wall_backstop_s is None else float(wall_backstop_s)
        if not self.wall_backstop_s > 0:
            raise ValueError(f"wall_backstop_s must be > 0, got {wall_backstop_s}")
        self.inline_reason: str | None = None
        self._ctx = None
        if num_workers > 0:
            self._ctx = mp.get_context(start_method)
            if start_method == "forkserver":
                # Only takes effect if this process has not started its fork server yet.
                self._ctx.set_forkserver_preload(PRELOAD_MODULES)
            try:
                self._workers = [_Worker(self._ctx, self.scorer) for _ in range(num_workers)]
            except (OSError, RuntimeError, EOFError) as exc:  # no process can be started here (limits, fork server)
                for worker in self._workers:
                    worker.kill()
                self._workers = []
                self.inline_reason = f"cannot start a worker process: {type(exc).__name__}: {exc}"
                logger.warning(
                    "reward scoring workers could not start (%s): grading in the trainer's process", self.inline_reason
                )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def score(self, items: Sequence[ScoreItem]) -> tuple[list[ScoreResult], PoolStats]:
        """Grade every item; a timed-out or failed item gets ``ScoreResult(0.0, False)``."""
        if self._closed:
            raise RuntimeError("ScoringPool is closed")
        with self._lock:
            start = time.perf_counter()
            stats = PoolStats()
            if self.num_workers == 0 or self.inline_reason is not None:
                results = [self._score_inline(item, stats) for item in items]
            else:
                results = self._score_in_workers(list(items), stats)
            stats.parse_fail_count = sum(1 for r in results if r.parse_failed)
            stats.unparseable_count = sum(1 for r in results if r.unparseable)
            # Pool kills are counted where they happen; in-process budget hits come back in the results.
            stats.timeout_count += sum(1 for r in results if r.timed_out)
            stats.wall_timeout_count += sum(1 for r in results if r.wall_timed_out)
            stats.score_time_s = time.perf_counter() - start
            return results, stats

    def _score_inline(self, item, stats: PoolStats) -> ScoreResult:
        try:
            return self.scorer.score(*item)
        except Exception as exc:  # noqa: BLE001 - counted, never silent
            stats.error_count += 1
            stats.errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            return ScoreResult(0.0, False)

    def _replace(self, worker: _Worker) -> _Worker | None:
        worker.kill()
        try:
            fresh = _Worker(self._ctx, self.scorer)
        except (OSError, RuntimeError, EOFError) as exc:  # no new process (limits, fork server gone)
            self._give_up(worker, f"cannot start a replacement worker: {type(exc).__name__}: {exc}")
            return None
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def _handle_ready(self, worker: _Worker, stats: PoolStats) -> None:
        """Consume a starting worker's READY message (or its death) and mark it usable."""
        try:
            task_id, ok, info = worker.conn.recv()
        except (EOFError, OSError):
            ok, info, task_id = False, "worker exited during start-up", READY
        if task_id != READY or not ok:
            self._start_failures += 1
            if self._start_failures >= 3:
                self._give_up(worker, f"start-up failed {self._start_failures} times in a row ({info})")
                return
            stats.worker_restarts += 1
            self._replace(worker)
            return
        self._start_failures = 0
        worker.ready = True

    def _give_up(self, worker: _Worker, reason: str) -> None:
        """Drop a worker that cannot start; with none left, grade in this process from now on."""
        worker.kill()
        if worker in self._workers:
            self._workers.remove(worker)
        if self._workers or self.inline_reason is not None:
            logger.warning("reward scoring worker dropped (%s); %d left", reason, len(self._workers))
            return
        self.inline_reason = reason
        logger.warning(
            "reward scoring workers could not start (%s): grading in the trainer's process from now "
            "on (the built-in graders bound each item in CPU time; no pool kill for a hung custom "
            "compute_score)",
            reason,
        )

    def _check_startup(self, now: float) -> None:
        for worker in [w for w in self._workers if not w.ready]:
            if worker.startup_stalled(now):
                self._give_up(worker, f"no CPU progress in {STARTUP_STALL_S:.0f} s of start-up")
            elif now - worker.started_at > STARTUP_LIMIT_S:
                self._give_up(worker, f"not ready after {STARTUP_LIMIT_S:.0f} s of start-up")

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until every worker has warmed up or was given up (``score`` waits by itself); True when
        the workers grade, False when the pool grades in-process (or ``timeout_s`` passed first)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stats = PoolStats()
        while True:
            self._check_startup(time.monotonic())
            starting = [w for w in self._workers if not w.ready]
            if not starting:
                return self.inline_reason is None
            wait_s = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait_s <= 0:
                return False
            for conn in wait_for_ready([w.conn for w in starting], timeout=wait_s):
                worker = next((w for w in starting if w.conn is conn), None)
                if worker is not None and worker in self._workers:
                    self._handle_ready(worker, stats)

    def _chunk_size(self, pending: int) -> int:
        # Several items per message keep a worker busy while the parent waits for CPU on a loaded
        # machine; small chunks keep the end of a batch balanced across workers.
        return max(1, min(MAX_CHUNK, pending // (2 * max(1, len(self._workers)))))

    def _score_in_workers(self, items: list, stats: PoolStats) -> list[ScoreResult]:
        """Dispatch chunks to ready workers; each reply restarts the worker's deadline for its next item.

        The deadline therefore always belongs to the oldest unanswered item of a worker: when it passes,
        that item scores 0, the worker is replaced, and the rest of its chunk goes back to the queue.
        """
        results: list[ScoreResult | None] = [None] * len(items)
        pending = collections.deque(range(len(items)))
        while pending or any(w.tasks for w in self._workers):
            for worker in list(self._workers):
                # A worker that warmed up long before this first batch has its READY waiting in the pipe:
                # read it before judging the start-up time (found by the recipe rehearsal).
                if not worker.ready and worker.conn.poll():
                    self._handle_ready(worker, stats)
            self._check_startup(time.monotonic())
            if self.inline_reason is not None:  # every worker was given up: grade the rest here
                for task in pending:
                    results[task] = self._score_inline(items[task], stats)
                pending.clear()
                break
            for worker in list(self._workers):
                if worker.ready and not worker.tasks and pending:
                    chunk = [pending.popleft() for _ in range(min(len(pending), self._chunk_size(len(pending))))]
                    try:
                        worker.conn.send([(task, items[task]) for task in chunk])
                    except (BrokenPipeError, OSError):
                        pending.extendleft(reversed(chunk))
                        stats.worker_restarts += 1
                        self._replace(worker)
                        continue
                    worker.tasks.extend(chunk)
                    worker.start_item(self.wall_backstop_s)
            busy = {w.conn: w for w in self._workers if w.tasks}
            starting = {w.conn: w for w in self._workers if not w.ready}
            if not busy and not starting:
                continue
            # A process gains at most one CPU second per wall second: no budget can run out sooner.
            now = time.monotonic()
            waits = [1.0] + [min(w.cpu_left(self.timeout_s), w.wall_deadline - now) for w in busy.values()]
            wait_s = max(0.005, min(waits))
            for conn in wait_for_ready(list(busy) + list(starting), timeout=wait_s):
                if conn in starting:
                    self._handle_ready(starting[conn], stats)
                    continue
                worker = busy[conn]
                try:
                    # Drain every reply already in the pipe before looking at deadlines.
                    while worker.tasks:
                        task_id, ok, payload = conn.recv()
                        task = worker.tasks.popleft()
                        if task_id != task:
                            raise RuntimeError(f"scoring worker answered item {task_id} while {task} was next")
                        worker.start_item(self.wall_backstop_s)
                        if ok:
                            results[task] = ScoreResult(*payload)
                        else:
                            stats.error_count += 1
                            stats.errors.append(payload)
                            results[task] = ScoreResult(0.0, False)
                        if not conn.poll():
                            break
                except (EOFError, OSError):
                    # The worker died mid-item (segfault, OOM kill): count it and start a new one.
                    task = worker.tasks.popleft()
                    stats.error_count += 1
                    stats.errors.append(f"worker exited while scoring item {task}")
                    results[task] = ScoreResult(0.0, False)
                    pending.extendleft(reversed(worker.tasks))
                    worker.tasks.clear()
                    stats.worker_restarts += 1
                    self._replace(worker)
            now = time.monotonic()
            for worker in list(self._workers):
                if not worker.tasks:
                    continue
                wall_hit = worker.wall_deadline <= now
                if wall_hit or worker.cpu_left(self.timeout_s) <= 0:
                    results[worker.tasks.popleft()] = ScoreResult(0.0, False)  # timed_out stays False: counted here
                    pending.extendleft(reversed(worker.tasks))
                    worker.tasks.clear()
                    stats.timeout_count += 1
                    stats.wall_timeout_count += int(wall_hit)
                    stats.worker_restarts += 1
                    self._replace(worker)
        return results  # type: ignore[return-value]

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (for monitoring and benchmarks)."""
        return [w.process.pid for w in self._workers]

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
            pass
