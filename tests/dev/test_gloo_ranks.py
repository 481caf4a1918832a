"""luffy_pool_dev.gloo_ranks (dev/), the gloo-ranks runner of the tests and bench_memory: every rank joins one group,
return values come back in rank order, and a failing or hanging rank fails the call."""

import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing import ProcessRaisedException

from luffy_pool_dev.gloo_ranks import run_gloo_ranks


def _sum_of_ranks(rank, world, port, offset):
    dist.init_process_group("gloo")  # from the env the runner sets
    t = torch.tensor([rank + offset])
    dist.all_reduce(t)
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")}
    dist.destroy_process_group()
    return {"sum": int(t), "env": env, "threads": torch.get_num_threads()}


def _rank_one_fails(rank, world, port):
    if rank == 1:
        raise ValueError("rank one is broken")


def _rank_zero_hangs(rank, world, port):
    if rank == 0:
        time.sleep(60)


@pytest.mark.slow  # forks gloo ranks
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_ranks_join_one_group_and_return_in_rank_order(start_method):
    results = run_gloo_ranks(_sum_of_ranks, 3, 10, start_method=start_method)
    assert [r["sum"] for r in results] == [33, 33, 33]  # 10 + 11 + 12
    assert [r["env"]["RANK"] for r in results] == ["0", "1", "2"]
    assert [r["env"]["LOCAL_RANK"] for r in results] == ["0", "1", "2"]
    assert {r["env"]["WORLD_SIZE"] for r in results} == {r["env"]["LOCAL_WORLD_SIZE"] for r in results} == {"3"}
    assert len({r["env"]["MASTER_PORT"] for r in results}) == 1
    assert all(r["threads"] == 1 for r in results)


@pytest.mark.slow  # forks gloo ranks
def test_a_failing_rank_fails_the_run_with_its_error():
    with pytest.raises(ProcessRaisedException, match="rank one is broken"):
        run_gloo_ranks(_rank_one_fails, 2)


@pytest.mark.slow  # forks gloo ranks
def test_a_hanging_rank_is_killed_at_the_timeout():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="_rank_zero_hangs did not finish in 3 s"):
        run_gloo_ranks(_rank_zero_hangs, 2, timeout_s=3)
    assert time.monotonic() - start < 30


def _mesh_fails_on_the_first_start(rank, world, port, marker):
    if rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer [127.0.0.1]:52122")
    return port


def _fails_every_time(rank, world, port, marker):
    with open(marker, "a") as f:
        f.write(f"{rank}\n")
    if rank == 1:
        raise ValueError("a bug of the rank's own")


@pytest.mark.slow  # forks gloo ranks
def test_a_failed_mesh_connect_starts_the_ranks_again_once_on_a_new_port(tmp_path, capfd):
    ports = run_gloo_ranks(_mesh_fails_on_the_first_start, 2, str(tmp_path / "failed_once"))
    assert len(set(ports)) == 1  # both ranks of the second start, on one port
    assert "gloo could not connect its ranks" in capfd.readouterr().err


@pytest.mark.slow  # forks gloo ranks
def test_any_other_rank_error_is_not_retried(tmp_path):
    marker = tmp_path / "starts"
    with pytest.raises(ProcessRaisedException, match="a bug of the rank's own"):
        run_gloo_ranks(_fails_every_time, 2, str(marker))
    assert marker.read_text().split().count("1") == 1  # the failing rank started once, not twice
