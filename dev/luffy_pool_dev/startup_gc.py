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

- ``startup_without_gc()``: a block of start-up work (imports, building the engine); ``build_engines_without_gc``
  runs every vLLM engine build of the process in one (the vLLM plugin, vllm_plugin.py, calls it);
- ``pause_for_startup`` / ``end_startup``: a process's start-up from its first line: the test collection
  (tests/conftest.py), and each worker rank through Ray's ``worker_process_setup_hook`` (``pause_in_ray_worker``, set
  by the actor hook, fork_workers.py) before it imports its class, until verl's ``Worker`` constructs it. A paused
  process that never ends its start-up has the collector back after ``PAUSE_LIMIT_S``.

Test and rehearsal machinery: the product's processes run with the collector as Python sets it.
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


def pause_in_ray_worker() -> None:
    """Ray's ``worker_process_setup_hook`` of a worker rank: runs before the rank imports its class; the start-up ends
    when verl's ``Worker`` constructs the rank (its ``__new__``, which every worker class runs, wrapped here)."""
    pause_for_startup()
    from verl.single_controller.base.worker import Worker

    original = Worker.__new__
    if getattr(original, "ends_startup", False):
        return

    def __new__(cls, *args, **kwargs):
        end_startup()
        return original(cls, *args, **kwargs)

    __new__.ends_startup = True
    Worker.__new__ = staticmethod(__new__)


def build_engines_without_gc() -> bool:
    """Run every vLLM engine build of this process (``LLMEngine.from_engine_args``, which ``vllm.LLM`` calls) in
    ``startup_without_gc``: vLLM's start-up makes no garbage and collects the whole heap five times. Called from the
    first build's own arguments check (vLLM loads its plugins there), so that build is covered too. False when this
    vLLM has no such method."""
    try:
        from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError:
        return False
    original = LLMEngine.__dict__.get("from_engine_args")
    if not isinstance(original, classmethod):
        return False
    if getattr(original.__func__, "without_gc", False):
        return True

    def from_engine_args(cls, *args, **kwargs):
        with startup_without_gc():
            return original.__func__(cls, *args, **kwargs)

    from_engine_args.without_gc = True
    LLMEngine.from_engine_args = classmethod(from_engine_args)
    return True
