"""trainer.cpu_bind: each local CPU rank gets its own slice of the allowed cores."""

import multiprocessing as mp
import os

import pytest

from luffy_pool.config.sections import ConfigSections
from luffy_pool.run.launcher import resolve_cpu_bind

S = ConfigSections.from_config
from verl.utils.cpu_bind import bind_cpu_rank, cpu_slice


def test_cpu_slice_hand_cases():
    assert cpu_slice(0, 2, [0, 1]) == [0] and cpu_slice(1, 2, [1, 0]) == [1]
    assert cpu_slice(1, 2, [4, 5, 6, 7, 8]) == [6, 7]  # 2 cores each; the odd core stays unused
    assert cpu_slice(0, 1, [3, 1]) == [1, 3]
    assert cpu_slice(2, 3, [0, 1]) is None  # more ranks than cores: no binding
    with pytest.raises(ValueError, match="local_rank 2 is not within local_world_size 2"):
        cpu_slice(2, 2, [0, 1])


def _bind_in_child(queue, mode, rank, world):
    queue.put((bind_cpu_rank(mode, rank, world), sorted(os.sched_getaffinity(0))))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity API on this OS")
def test_bind_pins_a_process_to_its_slice_and_none_leaves_it():
    allowed = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")  # a child, so the test process keeps its own affinity
    for mode, rank, world in (("auto", len(allowed) - 1, len(allowed)), ("none", 0, 1)):
        queue = ctx.Queue()
        proc = ctx.Process(target=_bind_in_child, args=(queue, mode, rank, world))
        proc.start()
        bound, affinity = queue.get(timeout=30)
        proc.join(timeout=30)
        if mode == "auto":
            assert bound == [allowed[-1]] and affinity == [allowed[-1]]
        else:
            assert bound is None and affinity == allowed
    with pytest.raises(ValueError, match="trainer.cpu_bind must be one of"):
        bind_cpu_rank("all", 0, 1)


def test_launcher_resolves_the_mode_for_the_workers(compose_config):
    def cfg(bind="auto", rollout="hf"):
        config = compose_config(
            [
                "data.train_files=x",
                "data.val_files=null",
                "actor_rollout_ref.model.path=m",
                f"actor_rollout_ref.rollout.name={rollout}",
            ]
        )
        config.trainer.cpu_bind = bind  # after composing: a bad value is the checker's to refuse
        return config

    assert resolve_cpu_bind(S(cfg()), "cpu") == "auto"
    assert resolve_cpu_bind(S(cfg(rollout="vllm")), "cpu") == "none"  # vLLM's CPU backend binds its own threads
    assert resolve_cpu_bind(S(cfg()), "cuda") == "none"
    assert resolve_cpu_bind(S(cfg(bind="none")), "cpu") == "none"
    from luffy_pool.config.check import validate_config

    assert any("trainer.cpu_bind" in e and "'yes'" in e for e in validate_config(cfg(bind="yes")))
