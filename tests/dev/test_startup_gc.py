"""luffy_pool_dev.startup_gc (dev/): the collector paused through a process's start-up, what it built frozen at the
end, and automatic collection back afterwards (also when nothing ends the pause); a Ray worker rank's pause ends when
verl's Worker constructs it, and vLLM engine builds run without the collector."""

import gc
import subprocess
import sys
import textwrap

import pytest

from luffy_pool_dev import startup_gc


@pytest.fixture(autouse=True)
def _collector_restored():
    yield
    startup_gc.end_startup()
    gc.enable()
    gc.unfreeze()


def test_a_paused_start_up_collects_nothing_and_its_end_freezes_and_collects_again():
    startup_gc.pause_for_startup()
    assert not gc.isenabled()
    built = [[i] for i in range(1000)]  # what a start-up imports: alive for the whole process (tracked by gc)
    frozen_before = gc.get_freeze_count()
    startup_gc.end_startup()
    assert gc.isenabled() and gc.get_freeze_count() >= frozen_before + len(built)
    startup_gc.end_startup()  # a second end (another worker constructor) changes nothing
    assert gc.isenabled()


def test_a_process_without_the_collector_keeps_it_off():
    gc.disable()
    startup_gc.pause_for_startup()
    startup_gc.end_startup()
    assert not gc.isenabled()  # the pause never took it, so its end does not turn it on


def test_the_block_freezes_what_exists_first_so_explicit_collections_inside_walk_only_new_objects():
    class Cycle:
        pass

    with startup_gc.startup_without_gc():
        assert not gc.isenabled()
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2  # the cycle made inside the block is still collectable by an explicit collect
    assert gc.isenabled()


def test_a_pause_nobody_ends_gives_the_collector_back_after_its_limit():
    code = textwrap.dedent("""
        import gc, time
        from luffy_pool_dev import startup_gc
        startup_gc.pause_for_startup(limit_s=0.2)
        assert not gc.isenabled()
        deadline = time.monotonic() + 30
        while not gc.isenabled() and time.monotonic() < deadline:
            time.sleep(0.02)
        print("enabled" if gc.isenabled() else "still paused")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "enabled", out.stderr


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_a_ray_workers_pause_ends_when_verls_worker_constructs_it():
    """Ray's setup hook (pause_in_ray_worker) runs before the rank imports its class; constructing any Worker
    subclass, one that never calls Worker.__init__ included, ends the pause; a second hook call wraps nothing twice."""
    assert (
        _run("""
        import gc
        from luffy_pool_dev import startup_gc
        startup_gc.pause_in_ray_worker()
        startup_gc.pause_in_ray_worker()
        paused = not gc.isenabled()
        from verl.single_controller.base.worker import Worker

        class Rank(Worker):
            def __init__(self, x):
                self.x = x

        rank = Rank(3)
        print(paused, gc.isenabled(), gc.get_freeze_count() > 1000, rank.x, rank.rank)
    """)
        == "True True True 3 0"
    )


@pytest.mark.slow  # imports vLLM's engine classes (~8 s)
def test_every_vllm_engine_build_runs_without_the_collector():
    """build_engines_without_gc wraps vLLM's LLMEngine.from_engine_args (what vllm.LLM calls) once: inside it the
    collector is off and what existed before is frozen; after it the collector is back."""
    assert (
        _run("""
        import gc
        from vllm.v1.engine.llm_engine import LLMEngine
        from luffy_pool_dev import startup_gc
        seen = []
        def fake(cls, *args):
            seen.append((gc.isenabled(), gc.get_freeze_count()))
            return args
        LLMEngine.from_engine_args = classmethod(fake)
        before = gc.get_freeze_count()
        assert startup_gc.build_engines_without_gc() and startup_gc.build_engines_without_gc()
        assert LLMEngine.from_engine_args("args") == ("args",)
        print(seen[0][0], seen[0][1] > before, gc.isenabled(), len(seen))
    """)
        == "False True True 1"
    )
