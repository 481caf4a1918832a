"""Colocated roles: two worker classes fused into one WorkerDict process per rank, their methods
exposed as ``<role>_<method>`` and, through ``spawn``, as per-role views with the plain names."""

from __future__ import annotations

import os
import sys

import pytest
from ray import cloudpickle

from verl.single_controller.base import Dispatch, Worker, register
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ActorRole(Worker):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self):
        return {"role": "actor", "pid": os.getpid(), "rank": self.rank, "lr": self.lr}

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def add_one(self, value):
        return value + 1


class CriticRole(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self):
        return {"role": "critic", "pid": os.getpid(), "rank": self.rank}

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def head_size(self):
        return 1


@pytest.fixture(scope="module")
def colocated(ray_session):
    pool = RayResourcePool([2], use_gpu=False)
    worker_dict = create_colocated_worker_cls(
        {"actor": RayClassWithInitArgs(ActorRole, lr=0.5), "critic": RayClassWithInitArgs(CriticRole)}
    )
    group = RayWorkerGroup(pool, worker_dict, name_prefix="colocated")
    yield group
    group.shutdown()
    pool.release()


def test_roles_share_one_process_per_rank(colocated):
    actors, critics = colocated.actor_describe(), colocated.critic_describe()
    assert [a["pid"] for a in actors] == [c["pid"] for c in critics]
    assert actors[0]["pid"] != actors[1]["pid"]
    assert [a["rank"] for a in actors] == [0, 1] and [c["rank"] for c in critics] == [0, 1]
    assert {a["lr"] for a in actors} == {0.5}


def test_role_methods_keep_their_dispatch_modes(colocated):
    assert colocated.actor_add_one([10, 20]) == [11, 21]
    assert colocated.critic_head_size() == 1


def test_spawn_gives_per_role_views_with_plain_names(colocated):
    views = colocated.spawn({"actor", "critic"})
    assert [d["role"] for d in views["actor"].describe()] == ["actor", "actor"]
    assert [d["role"] for d in views["critic"].describe()] == ["critic", "critic"]
    assert views["critic"].head_size() == 1
    assert not hasattr(views["actor"], "head_size")
    with pytest.raises(ValueError, match="has no role 'ref'"):
        colocated.spawn({"ref"})


def test_colocation_rejects_bad_roles():
    with pytest.raises(ValueError, match="must be a Python identifier"):
        create_colocated_worker_cls({"actor-1": RayClassWithInitArgs(CriticRole)})
    with pytest.raises(TypeError, match="role 'actor' must be a RayClassWithInitArgs"):
        create_colocated_worker_cls({"actor": CriticRole})
    with pytest.raises(ValueError, match="disagree on actor option 'max_concurrency'"):
        create_colocated_worker_cls(
            {"a": _with_options({"max_concurrency": 1}), "b": _with_options({"max_concurrency": 2})}
        )


def _with_options(options: dict) -> RayClassWithInitArgs:
    cls = RayClassWithInitArgs(CriticRole)
    cls.update_options(options)
    return cls
