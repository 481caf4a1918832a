"""WorkerGroupError messages (who failed, who was still running, timeouts) and its pickling, which
lets it travel inside a Ray task error when a worker resolves a failed DataProtoFuture."""

from __future__ import annotations

import pickle

from verl.single_controller.ray import WorkerGroupError


def test_single_failure_message_names_group_method_rank_and_cause():
    error = WorkerGroupError("actor_rollout", "update_actor", {1: ValueError("nan loss")})
    assert str(error) == "worker group 'actor_rollout' method 'update_actor' failed on rank 1: ValueError: nan loss"


def test_several_failures_and_pending_ranks_are_listed():
    error = WorkerGroupError("g", "m", {2: KeyError("a"), 0: RuntimeError("b")}, pending_ranks=[1])
    assert str(error) == (
        "worker group 'g' method 'm' failed on ranks [0, 2]: rank 0: RuntimeError: b; "
        "rank 2: KeyError: 'a'; ranks [1] had not answered and were not waited for"
    )


def test_timeout_message():
    error = WorkerGroupError("g", "generate", {}, pending_ranks=[0, 1], timed_out=True, timeout_s=5.0)
    assert str(error) == "worker group 'g' method 'generate' timed out after 5.0 s waiting for ranks [0, 1]"


def test_pickle_round_trip_keeps_message_and_fields():
    error = WorkerGroupError("g", "m", {1: ValueError("x")}, pending_ranks=[0])
    back = pickle.loads(pickle.dumps(error))
    assert str(back) == str(error)
    assert back.failures == {1: "ValueError: x"} and back.pending_ranks == [0] and back.group_name == "g"
