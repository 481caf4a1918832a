"""The split engine's weight push over its own gloo group: bucket framing, dtypes, the end mark, the receiver's
manager feeding its engine (threads in one process stand in for the actor's rank 0 and two rollout ranks)."""

import threading

import pytest
import torch

from verl.workers.sharding_manager.collective_sync import SplitRolloutManager, WeightGroup, connect, listen, node_host


def _run_group(size, member, timeout_s=30):
    """Start ``size`` members joining one group; ``member(group)`` runs in each; returns their results by rank."""
    host, port, server = listen(timeout_s)
    results, errors = [None] * size, []

    def body(rank):
        try:
            store = server if rank == 0 else connect(host, port, timeout_s)
            group = WeightGroup.join(store, rank, size, "cpu", timeout_s=timeout_s)
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
    [
        ("a.weight", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        ("a.bias", torch.tensor([1.5], dtype=torch.bfloat16)),
    ],
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


def test_the_gloo_group_gets_the_runs_timeout_not_torchs_default():
    def member(group):
        return group.pg.options._timeout.total_seconds()

    assert _run_group(2, member, timeout_s=1234) == [1234.0, 1234.0]  # gloo's own default is 1800 s


def test_the_nccl_group_gets_the_runs_timeout_in_its_options(monkeypatch):
    """The CPU build has no NCCL: a stand-in with the constructor's signature records the options it is given."""
    import datetime

    import torch.distributed as dist

    from verl.workers.sharding_manager.collective_sync import new_process_group

    class _Options:
        _timeout = datetime.timedelta(minutes=10)  # torch's NCCL default, what a group built without options keeps

    class _NCCL:
        Options = _Options

        def __init__(self, store, rank, size, options):
            self.rank, self.size, self.options = rank, size, options

    monkeypatch.setattr(dist, "ProcessGroupNCCL", _NCCL, raising=False)
    pg = new_process_group(dist.HashStore(), 1, 3, "cuda", timeout_s=2700)
    assert (pg.rank, pg.size, pg.options._timeout) == (1, 3, datetime.timedelta(seconds=2700))


def test_listen_holds_its_port_until_the_store_is_gone():
    """The port is bound from the moment it is handed out: another process binding it fails (binding, closing and
    handing the number out would leave it free here)."""
    import errno
    import socket

    host, port, store = listen(30)
    # the loopback, or this node's IP when an earlier test of this process left Ray initialised
    assert host == node_host() and port > 0 and store.port == port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        with pytest.raises(OSError) as err:
            other.bind(("", port))
    assert err.value.errno == errno.EADDRINUSE


def test_a_member_that_never_comes_fails_the_rendezvous_after_the_timeout():
    import time

    _, _, store = listen(2)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"ranks \[1\] of 2 did not join within actor_rollout_ref.nccl_timeout=2 s"):
        WeightGroup.join(store, 0, 2, "cpu", timeout_s=2)
    assert 1.5 < time.perf_counter() - t0 < 20
