"""Failures surface in the driver as WorkerGroupError naming the group, rank(s) and method, never as a
hang: a worker process that dies mid-call while its peer is stuck, a constructor that raises, pools
the cluster cannot hold.
Workers here import no torch so their processes start fast."""

from __future__ import annotations

import os
import sys
import time

import pytest
from ray import cloudpickle

from verl.single_controller.base import Dispatch, Worker, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, WorkerGroupError

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FragileWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on_one_block_on_zero(self, block_s):
        if self.rank == 1:
            os._exit(1)
        time.sleep(block_s)  # like a rank stuck in a collective whose peer is gone
        return self.rank


class BrokenInitWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        if self.rank == 1:
            raise RuntimeError("bad config on rank 1")


class NotAWorker:
    pass


@pytest.fixture
def pool(ray_session):
    pool = RayResourcePool([2], use_gpu=False)
    yield pool
    pool.release()


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_killed_worker_raises_without_waiting_for_stuck_rank_then_check_alive_fails(pool):
    group = RayWorkerGroup(pool, RayClassWithInitArgs(FragileWorker), name_prefix="fragile")
    try:
        with pytest.raises(WorkerGroupError) as info:
            group.exit_on_one_block_on_zero(120)
        message = str(info.value)
        assert "worker group 'fragile' method 'exit_on_one_block_on_zero' failed on rank 1" in message
        assert "worker process died" in message
        # Rank 0 is still sleeping: the driver gave up on it instead of hanging.
        assert sorted(info.value.failures) == [1] and info.value.pending_ranks == [0]
        assert "ranks [0] had not answered and were not waited for" in message
        with pytest.raises(WorkerGroupError, match="method 'check_alive' failed on rank 1") as alive:
            group.check_alive(timeout_s=30)
        assert sorted(alive.value.failures) == [1]
    finally:
        group.shutdown()


def test_constructor_error_surfaces_when_group_is_created(pool):
    with pytest.raises(WorkerGroupError) as info:
        RayWorkerGroup(pool, RayClassWithInitArgs(BrokenInitWorker), name_prefix="broken")
    message = str(info.value)
    assert "worker group 'broken' method '__init__' failed on rank 1" in message
    assert "the worker's constructor raised: RuntimeError: bad config on rank 1" in message


def test_worker_class_must_be_a_worker(pool):
    with pytest.raises(TypeError, match="must subclass verl.single_controller.base.Worker"):
        RayWorkerGroup(pool, RayClassWithInitArgs(NotAWorker))


def test_gpu_pool_on_cpu_cluster_fails_fast(ray_session):
    with pytest.raises(ValueError, match="needs 1 GPU .* has 0 \\(pass use_gpu=False"):
        RayResourcePool([1], use_gpu=True).get_placement_groups()


def test_pool_larger_than_cluster_fails_fast(ray_session):
    with pytest.raises(ValueError, match="needs 64 CPU for process_on_nodes=\\[64\\]"):
        RayResourcePool([64], use_gpu=False).get_placement_groups()


def test_two_node_pool_on_a_single_node_cluster_is_rejected(ray_session):
    pool = RayResourcePool([1, 1], use_gpu=False)
    with pytest.raises(RuntimeError, match="needs its own node"):
        pool.get_placement_groups()
    assert pool.pgs is None  # released again


def test_pools_may_share_a_name_prefix(ray_session):
    first, second = (
        RayResourcePool([1], use_gpu=False, name_prefix="same"),
        RayResourcePool([1], use_gpu=False, name_prefix="same"),
    )
    try:
        assert len(first.get_placement_groups()) == len(second.get_placement_groups()) == 1
    finally:
        first.release()
        second.release()


def test_pool_shape_is_validated():
    with pytest.raises(ValueError, match="process_on_nodes\\[1\\] must be a positive int"):
        RayResourcePool([1, 0], use_gpu=False)
