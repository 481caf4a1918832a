"""Waiting on the Ray calls of a worker group without hanging and with errors that say who failed.

``get_ranked`` gathers one ObjectRef per rank. As soon as a rank fails (its method raised or its
process died) it waits a short grace period for the other ranks, then raises ``WorkerGroupError``
naming the group, the method and every failed or still-running rank: ranks blocked in a collective
with a dead peer would otherwise hold the driver forever.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

__all__ = ["WorkerGroupError", "describe_remote_error", "get_ranked"]

# How long to keep collecting other ranks' errors after the first failure, and how often to poll.
DEFAULT_GRACE_S = 2.0
_POLL_S = 0.5
_MAX_DETAIL_CHARS = 600


class WorkerGroupError(RuntimeError):
    """A worker-group call failed, died or timed out on some ranks.

    Attributes: ``group_name``, ``method_name``, ``failures`` ({rank: exception or its description}),
    ``pending_ranks`` (ranks that had not answered when the driver gave up) and ``timed_out``.
    """

    def __init__(
        self,
        group_name: str,
        method_name: str,
        failures: dict,
        pending_ranks: Sequence[int] = (),
        timed_out: bool = False,
        timeout_s: Optional[float] = None,
    ):
        self.group_name = group_name
        self.method_name = method_name
        self.failures = dict(failures)
        self.pending_ranks = list(pending_ranks)
        self.timed_out = timed_out
        self.timeout_s = timeout_s
        parts = []
        details = {
            rank: describe_remote_error(err) if isinstance(err, BaseException) else str(err)
            for rank, err in self.failures.items()
        }
        ranks = sorted(details)
        if len(ranks) == 1:
            parts.append(f"failed on rank {ranks[0]}: {details[ranks[0]]}")
        elif ranks:
            parts.append(f"failed on ranks {ranks}: " + "; ".join(f"rank {r}: {details[r]}" for r in ranks))
        if timed_out:
            parts.append(f"timed out after {timeout_s} s waiting for ranks {self.pending_ranks}")
        elif self.pending_ranks:
            parts.append(f"ranks {self.pending_ranks} had not answered and were not waited for")
        self._details = details
        super().__init__(f"worker group '{group_name}' method '{method_name}' " + "; ".join(parts))

    def __reduce__(self):
        # Travels inside RayTaskError when a worker's DataProtoFuture.get() fails; the remote
        # exceptions themselves may not pickle, their one-line descriptions always do.
        return (
            WorkerGroupError,
            (self.group_name, self.method_name, self._details, self.pending_ranks, self.timed_out, self.timeout_s),
        )


def describe_remote_error(error: BaseException) -> str:
    """One line about a Ray call failure: the user exception, or why the actor died."""
    import ray.exceptions as rex

    if isinstance(error, rex.RayTaskError):
        cause = getattr(error, "cause", None)
        if cause is not None and not isinstance(cause, rex.RayTaskError):
            return _shorten(f"{type(cause).__name__}: {cause}")
        lines = [line for line in str(error).strip().splitlines() if line.strip()]
        return _shorten(lines[-1] if lines else type(error).__name__)
    if isinstance(error, rex.RayActorError):
        message = getattr(error, "error_msg", None) or str(error)
        if getattr(error, "actor_init_failed", False):
            # Ray appends the constructor's traceback; its last line is the exception itself.
            lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
            return _shorten(f"the worker's constructor raised: {lines[-1] if lines else message}")
        return _shorten(f"worker process died ({type(error).__name__}): {' '.join(message.split())}")
    return _shorten(f"{type(error).__name__}: {error}")


def _shorten(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 3] + "..."


def get_ranked(
    refs: Sequence[Any],
    ranks: Sequence[int],
    *,
    group_name: str,
    method_name: str,
    timeout_s: Optional[float] = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> list:
    """``ray.get`` of one ref per rank, returned in ``ranks`` order, or ``WorkerGroupError``.

    ``timeout_s=None`` waits as long as the ranks keep running; a failure on any rank ends the wait
    after ``grace_s`` even if other ranks are stuck.
    """
    import ray

    if len(refs) != len(ranks):
        raise ValueError(f"get_ranked: {len(refs)} refs but {len(ranks)} ranks")
    rank_of = {ref: rank for ref, rank in zip(refs, ranks)}
    values: dict = {}
    failures: dict = {}
    pending = list(refs)
    start = time.monotonic()
    first_failure_at: Optional[float] = None
    timed_out = False
    while pending:
        now = time.monotonic()
        limits = [_POLL_S]
        if timeout_s is not None:
            limits.append(start + timeout_s - now)
        if first_failure_at is not None:
            limits.append(first_failure_at + grace_s - now)
        wait_s = min(limits)
        if wait_s <= 0:
            timed_out = first_failure_at is None
            break
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        if not ready:
            continue
        try:
            for ref, value in zip(ready, ray.get(ready)):
                values[rank_of[ref]] = value
        except Exception:  # at least one ready ref failed: sort them out one by one
            for ref in ready:
                try:
                    values[rank_of[ref]] = ray.get(ref)
                except Exception as error:  # noqa: BLE001 - any remote failure is reported with its rank
                    failures[rank_of[ref]] = error
            if first_failure_at is None:
                first_failure_at = time.monotonic()
    if failures or pending:
        error = WorkerGroupError(
            group_name,
            method_name,
            failures,
            sorted(rank_of[r] for r in pending),
            timed_out=timed_out and not failures,
            timeout_s=timeout_s,
        )
        first = failures[min(failures)] if failures else None
        raise error from first
    return [values[rank] for rank in ranks]
