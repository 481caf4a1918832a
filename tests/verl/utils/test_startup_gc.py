"""verl.utils.startup_gc: the collector paused through a process's start-up, what it built frozen at the end, and
automatic collection back afterwards (also when nothing ends the pause)."""

import gc
import subprocess
import sys
import textwrap

import pytest

from verl.utils import startup_gc


@pytest.fixture(autouse=True)
def _collector_restored():
    yield
    startup_gc.end_startup()
    gc.enable()
    gc.unfreeze()


def test_a_paused_start_up_collects_nothing_and_its_end_freezes_and_collects_again():
    startup_gc.pause_for_startup()
    assert not gc.isenabled()
    built = [object() for _ in range(1000)]  # what a start-up imports: alive for the whole process
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
        from verl.utils import startup_gc
        startup_gc.pause_for_startup(limit_s=0.2)
        assert not gc.isenabled()
        deadline = time.monotonic() + 30
        while not gc.isenabled() and time.monotonic() < deadline:
            time.sleep(0.02)
        print("enabled" if gc.isenabled() else "still paused")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "enabled", out.stderr


def test_every_worker_actor_is_started_with_the_pause_as_its_setup_hook():
    from ray._private import ray_constants

    from verl.single_controller.ray import base

    assert base.SETUP_HOOK_ENV == ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR  # the variable Ray's worker reads
    module, name = base.STARTUP_GC_HOOK.rsplit(".", 1)
    assert getattr(__import__(module, fromlist=[name]), name) is startup_gc.pause_for_startup
