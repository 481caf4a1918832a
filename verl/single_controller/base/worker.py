"""Worker: the base class of every process a worker group launches (actor, rollout, ref, critic).

A worker learns its place from the environment the group sets (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). The Ray group chooses the rendezvous on rank 0's node
before launching; when a launcher leaves it unset, rank 0 picks its own address and a free port and
reports them through ``get_master_addr_port``. ``init_torch_distributed`` joins the process group.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any, Callable, Optional

from verl.single_controller.base.decorator import Dispatch, Execute, register

__all__ = ["DistributedEnv", "Worker", "default_dist_backend", "find_free_port"]


def default_dist_backend() -> str:
    """NCCL when this process sees a CUDA device, gloo otherwise."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


# Rendezvous ports come from below the kernel's ephemeral range and above Ray's worker ports (10002-19999 by
# default). A port the OS hands out for bind(0) lies inside the ephemeral range, where every outgoing connection
# (Ray opens hundreds) takes its local port too: between our pick and rank 0's TCPStore listen, one of those
# took it twice on a busy machine (EADDRINUSE at worker start). Nothing outside the range gets a port unasked.
RENDEZVOUS_PORT_LOW = 20000
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_low() -> int | None:
    try:
        with open(_EPHEMERAL_RANGE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, port))
        except OSError:
            return False
        return True


def find_free_port(addr: str = "") -> int:
    """A TCP port that is free on ``addr`` right now: a random one between ``RENDEZVOUS_PORT_LOW`` and the
    ephemeral range where the kernel says where that range starts and leaves 1024+ ports below it, else
    one the OS picks."""
    import random

    low = _ephemeral_low()
    if low is not None and low - RENDEZVOUS_PORT_LOW >= 1024:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(RENDEZVOUS_PORT_LOW, low)
            if _bindable(addr, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return int(sock.getsockname()[1])


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError as err:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from err


@dataclasses.dataclass(frozen=True)
class DistributedEnv:
    """This process's place in its worker group, as read from the environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environ(cls) -> "DistributedEnv":
        env = cls(
            rank=_env_int("RANK", 0),
            world_size=_env_int("WORLD_SIZE", 1),
            local_rank=_env_int("LOCAL_RANK", 0),
            local_world_size=_env_int("LOCAL_WORLD_SIZE", 1),
        )
        if not 0 <= env.rank < env.world_size:
            raise ValueError(f"RANK={env.rank} is out of range for WORLD_SIZE={env.world_size}")
        if not 0 <= env.local_rank < env.local_world_size:
            raise ValueError(f"LOCAL_RANK={env.local_rank} is out of range for LOCAL_WORLD_SIZE={env.local_world_size}")
        return env


class Worker:
    """Base class of group-launched workers; subclasses add ``@register``-ed methods.

    The environment is read in ``__new__`` so it is available even before a subclass's
    ``__init__`` runs (and in subclasses that forget ``super().__init__()``).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "Worker":
        instance = super().__new__(cls)
        instance._dist_env = DistributedEnv.from_environ()
        if instance._dist_env.rank == 0 and "WG_PREFIX" in os.environ:
            instance._ensure_master_addr_port()
        return instance

    # ------------------------------------------------------------------ identity
    @property
    def rank(self) -> int:
        return self._dist_env.rank

    @property
    def world_size(self) -> int:
        return self._dist_env.world_size

    @property
    def local_rank(self) -> int:
        return self._dist_env.local_rank

    @property
    def local_world_size(self) -> int:
        return self._dist_env.local_world_size

    def _ensure_master_addr_port(self) -> tuple[str, int]:
        # An empty value counts as unset, so a launcher can blank out values inherited from its own env.
        addr = os.environ.get("MASTER_ADDR") or ""
        port = os.environ.get("MASTER_PORT") or ""
        if not addr or not port:
            if self.rank != 0:
                raise RuntimeError(f"rank {self.rank}: MASTER_ADDR/MASTER_PORT are not set; only rank 0 picks them")
            addr = addr or _node_ip()
            port = port or str(find_free_port(addr))
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, port
        return addr, int(port)

    def get_master_addr_port(self) -> tuple[str, int]:
        """The rendezvous (address, port) of the group; rank 0 chooses them on first use."""
        return self._ensure_master_addr_port()

    def get_node_id(self) -> Optional[str]:
        """The Ray node id of this process (None outside Ray)."""
        try:
            import ray

            return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        except ImportError:
            return None

    # ------------------------------------------------------------------ torch.distributed
    def init_torch_distributed(self, backend: Optional[str] = None, timeout_s: float = 1800.0) -> str:
        """Join the default process group of this worker group; returns the backend used.

        ``backend`` defaults to NCCL on CUDA and gloo on CPU. Idempotent within a process.
        """
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        backend = backend or default_dist_backend()
        if dist.is_initialized():
            current = dist.get_backend()
            if current != backend:
                raise RuntimeError(f"torch.distributed is already initialised with '{current}', not '{backend}'")
            return current
        addr, port = self._ensure_master_addr_port()
        if backend == "nccl":
            # Each Ray GPU actor usually sees only its own device; with several visible, pick ours.
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{addr}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        return backend

    # ------------------------------------------------------------------ generic remote helpers
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``func(self, *chunks)`` on every rank; used for one-off data-parallel computations."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``func(self, ...)`` on rank 0 only."""
        return func(self, *args, **kwargs)
