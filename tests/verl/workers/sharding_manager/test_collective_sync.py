"""The split engine's weight push over its own gloo group: bucket framing, dtypes, the end mark, the receiver's
manager feeding its engine (threads in one process stand in for the actor's rank 0 and two rollout ranks)."""
import threading

import pytest
import torch

from verl.workers.sharding_manager.collective_sync import SplitRolloutManager, WeightGroup, free_address


def _run_group(size, member):
    """Start ``size`` members joining one group; ``member(group)`` runs in each; returns their results by rank."""
    host, port = free_address()
    results, errors = [None] * size, []

    def body(rank):
        try:
            group = WeightGroup.join(host, port, rank, size, "cpu", timeout_s=30)
            results[rank] = member(group)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


BUCKETS = [
    [("a.weight", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("a.bias", torch.tensor([1.5], dtype=torch.bfloat16))],
    [("b.weight", torch.tensor([[-2.0, 0.25, 3.0]], dtype=torch.bfloat16)), ("c", torch.tensor(7.0))],
]


def test_every_receiver_gets_each_bucket_bit_for_bit_in_order():
    def member(group):
        if group.rank == 0:
            return group.send(iter(BUCKETS))
        return list(group.receive())

    sent, *received = _run_group(3, member)
    assert sent == 2
    for buckets in received:
        assert [[n for n, _ in b] for b in buckets] == [["a.weight", "a.bias"], ["b.weight", "c"]]
        for got, want in zip(buckets, BUCKETS):
            for (_, g), (_, w) in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_a_receiver_cannot_send():
    def member(group):
        if group.rank == 1:
            with pytest.raises(RuntimeError, match="cannot send"):
                group.send([])
        return group.rank

    assert _run_group(2, member) == [0, 1]


class _Engine:
    def __init__(self):
        self.tensors, self.calls = {}, []

    def wake_up(self):
        self.calls.append("wake")

    def update_weights(self, bucket):
        self.tensors.update(dict(bucket))

    def after_weight_update(self):
        self.calls.append("done")

    def sleep(self):
        self.calls.append("sleep")


def test_the_split_manager_feeds_its_engine_and_allows_one_generation():
    engine = _Engine()

    def member(group):
        if group.rank == 0:
            return group.send(BUCKETS)
        manager = SplitRolloutManager(engine, group)
        manager.sync_weights()
        with manager:  # a generation on the pushed weights
            pass
        with pytest.raises(RuntimeError, match="without a weight push"):
            manager.__enter__()
        return manager.last_sync_buckets

    assert _run_group(2, member) == [2, 2]
    assert sorted(engine.tensors) == ["a.bias", "a.weight", "b.weight", "c"]
    assert torch.equal(engine.tensors["b.weight"], BUCKETS[1][0][1])
    assert engine.calls == ["wake", "done", "wake"]  # an engine on GPUs of its own never sleeps
