"""CPython's cyclic garbage collector around a process's start-up (drivers, Ray worker ranks, the rollout engine).

A driver or worker rank imports torch, transformers, Ray and (rollout ranks) vLLM: millions of objects that live as
long as the process. The collector, triggered by allocation counts, walks that growing heap again and again while it
is built, and finds nothing: measured on this machine kind, 28 % of the CPU of importing a worker's modules and vLLM
(11.9 -> 8.6 CPU-s per process). vLLM's engine start-up then calls ``gc.collect()`` five times over the whole heap
(its model loader twice, ``freeze_gc_heap`` three times: ~1 CPU-s each on a loaded rank).

So the collector pauses while a process starts, and what exists when the start-up ends is frozen (``gc.freeze``:
moved to the permanent generation, which no collection walks: the same thing vLLM does after its own start-up).
Collection then runs as usual over everything the process creates afterwards. Explicit ``gc.collect()`` calls still
run during a pause (over the objects not frozen).

- ``startup_without_gc()``: a block of start-up work (imports, building the engine);
- ``pause_for_startup`` / ``end_startup``: a process's start-up from its first line: the Ray job's
  ``worker_process_setup_hook`` pauses every worker process of the run before it imports its class, the worker's
  constructor ends it; the drivers pause at their first line and end before training. A paused process that never
  ends its start-up (a Ray task process, which runs no worker) has the collector back after ``PAUSE_LIMIT_S``.
"""

from __future__ import annotations

import contextlib
import gc
import threading

PAUSE_LIMIT_S = 300.0  # longer than any start-up (the slowest measured: ~60 s, a 4-rank rehearsal on a busy machine)

_lock = threading.Lock()
_paused = False


def pause_for_startup(limit_s: float = PAUSE_LIMIT_S) -> None:
    """Stop automatic collection until ``end_startup`` (or ``limit_s`` seconds, whichever comes first)."""
    global _paused
    with _lock:
        if _paused or not gc.isenabled():  # already paused, or the process runs without the collector on purpose
            return
        gc.disable()
        _paused = True
    timer = threading.Timer(limit_s, end_startup)
    timer.daemon = True
    timer.start()


def end_startup() -> None:
    """Freeze what the start-up built and give automatic collection back (a no-op when nothing paused it)."""
    global _paused
    with _lock:
        if not _paused:
            return
        gc.freeze()
        gc.enable()
        _paused = False


@contextlib.contextmanager
def startup_without_gc():
    """The block runs without automatic collection; what exists at its start is frozen first (so the explicit
    collections of the code inside walk only what the block creates) and what it built is frozen at its end."""
    was_enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
