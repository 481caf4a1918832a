"""Worker reads its place in the group from the environment (no Ray needed): rank properties,
validation of bad values, and who may choose the rendezvous address and port."""

from __future__ import annotations

import pytest

from verl.single_controller.base import Worker
from verl.single_controller.base.worker import default_dist_backend

GROUP_ENV = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "WG_PREFIX"]


@pytest.fixture
def clean_env(monkeypatch):
    # setenv first so monkeypatch records the original state and also undoes what Worker writes.
    for key in GROUP_ENV:
        monkeypatch.setenv(key, "unset")
        monkeypatch.delenv(key)
    return monkeypatch


class Subclass(Worker):
    def __init__(self, tag: str) -> None:  # no super().__init__(): the env is read in __new__
        self.tag = tag


def test_ranks_come_from_the_environment(clean_env):
    for key, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        clean_env.setenv(key, value)
    worker = Subclass("x")
    assert (worker.rank, worker.world_size, worker.local_rank, worker.local_world_size) == (3, 4, 1, 2)
    assert worker.tag == "x"


def test_defaults_outside_a_group_are_a_single_process(clean_env):
    worker = Worker()
    assert (worker.rank, worker.world_size, worker.local_rank, worker.local_world_size) == (0, 1, 0, 1)


def test_bad_environment_values_are_named(clean_env):
    clean_env.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer"):
        Worker()
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2 is out of range for WORLD_SIZE=2"):
        Worker()


def test_rank_zero_picks_and_keeps_the_rendezvous(clean_env):
    worker = Worker()
    addr, port = worker.get_master_addr_port()
    assert addr and 0 < port < 65536
    assert worker.get_master_addr_port() == (addr, port)


def test_only_rank_zero_may_pick_the_rendezvous(clean_env):
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="rank 1: MASTER_ADDR/MASTER_PORT are not set"):
        Worker().get_master_addr_port()


def test_default_backend_is_gloo_without_cuda():
    import torch

    assert default_dist_backend() == ("nccl" if torch.cuda.is_available() else "gloo")


def test_rendezvous_ports_come_from_below_the_ephemeral_range_and_skip_taken_ones(monkeypatch, tmp_path):
    """Outgoing connections take their local ports from the ephemeral range, so a port picked there could be
    taken again before rank 0 listens on it (EADDRINUSE seen on a busy machine)."""
    import socket

    from verl.single_controller.base import worker as w

    low = w._ephemeral_low()
    if low is not None and low - w.RENDEZVOUS_PORT_LOW >= 1024:
        for _ in range(20):
            port = w.find_free_port("127.0.0.1")
            assert w.RENDEZVOUS_PORT_LOW <= port < low
    # a taken port is never returned: every candidate but one is held by a listener
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    rng = tmp_path / "range"
    rng.write_text(f"{w.RENDEZVOUS_PORT_LOW + 2048}\t60999\n")
    monkeypatch.setattr(w, "_EPHEMERAL_RANGE", str(rng))
    tries = iter([taken, taken, w.RENDEZVOUS_PORT_LOW + 7])
    monkeypatch.setattr("random.SystemRandom.randrange", lambda self, a, b: next(tries))
    monkeypatch.setattr(w, "_bindable", lambda addr, port, real=w._bindable: port != taken and real(addr, port))
    assert w.find_free_port("127.0.0.1") == w.RENDEZVOUS_PORT_LOW + 7
    held.close()
    # no readable range: the OS picks
    monkeypatch.setattr(w, "_EPHEMERAL_RANGE", str(tmp_path / "missing"))
    assert 0 < w.find_free_port("127.0.0.1") < 65536
