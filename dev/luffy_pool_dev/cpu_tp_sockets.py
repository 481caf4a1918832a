"""vLLM-CPU tensor parallelism without vLLM's shared-memory kernels: the TP group's all-reduce and all-gather
go over a socket mesh between the group's ranks on one host.

vLLM-CPU reduces a TP group's activations in shared memory when its C extension has ``init_shm_manager``
(AVX-512 builds); otherwise (``_C_AVX2``, as on AVX2-only CPUs) its ``CpuCommunicator`` calls
``torch.distributed`` on the gloo group. Decoding calls that reduction about six times per token (embedding,
two per layer, the logits gather), and on gloo each small call costs ~1.1 ms of CPU per rank (its work queue
and transport threads hand every call over several times; measured: 2,000 all-reduces of 128 floats between
two ranks, 2.1 CPU-s per rank), against ~0.03 ms over a plain loopback socket (0.06 CPU-s). Replaces
``CpuCommunicator.dist_module`` (the seam vLLM's shared-memory path uses) for TP groups whose ranks share a
host and that fell back to ``torch.distributed``; anything other than a sum all-reduce or an all-gather goes to
``torch.distributed`` unchanged. Sums run in TP-rank order on every rank, so all ranks hold identical bits.
``mesh_tp_groups`` installs it in every CPU engine's TP group (the vLLM plugin, vllm_plugin.py, calls it on a CPU
platform only).
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import sys
from typing import Any, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_RANK = struct.Struct("!i")


class TPSocketMesh:
    """One connected socket per peer of a TP group; all-reduce (sum) and all-gather of contiguous tensors."""

    def __init__(self, rank: int, peers: dict[int, socket.socket], world_size: int, timeout_s: Optional[float]):
        self.rank, self.world_size, self.peers = rank, world_size, peers
        self.timeout_s = timeout_s
        self.selector = selectors.DefaultSelector()
        self.group: Any = None  # the process group the mesh stands for; a call naming another goes to torch

    def _ours(self, group: Any, async_op: bool, *tensors: torch.Tensor) -> bool:
        return (
            not async_op
            and (group is None or self.group is None or group is self.group)
            and all(t.is_contiguous() for t in tensors)
        )

    # ------------------------------------------------------------------ what vLLM's communicator calls
    def all_reduce(self, tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False):
        if not self._ours(group, async_op, tensor) or (op is not None and op != dist.ReduceOp.SUM):
            return dist.all_reduce(tensor, **({} if op is None else {"op": op}), group=group, async_op=async_op)
        parts = self._exchange(tensor)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        tensor.copy_(total)
        return None

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, group: Any = None, async_op: bool = False
    ):
        if not self._ours(group, async_op, tensor, output):
            return dist.all_gather_into_tensor(output, tensor, group=group, async_op=async_op)
        parts = self._exchange(tensor)
        output.view(self.world_size, *tensor.shape).copy_(torch.stack(parts))
        return None

    def __getattr__(self, name: str):  # gather, broadcast, send, recv, barrier: torch.distributed's
        return getattr(dist, name)

    # ------------------------------------------------------------------ transport
    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's copy of ``tensor`` (same shape and dtype on every rank), in TP-rank order."""
        mine = memoryview(tensor.detach().view(-1).view(torch.uint8).numpy())
        size = mine.nbytes
        inbox = {peer: bytearray(size) for peer in self.peers}
        sent = dict.fromkeys(self.peers, 0)
        got = dict.fromkeys(self.peers, 0)
        # non-blocking both ways: two ranks sending large tensors to each other must not wait on full buffers
        for peer, sock in self.peers.items():
            self.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, peer)
        try:
            pending = len(self.peers)
            while pending:
                events = self.selector.select(self.timeout_s)
                if not events:
                    late = sorted(p for p in self.peers if got[p] < size or sent[p] < size)
                    raise RuntimeError(
                        f"vLLM-CPU TP collective: no progress with TP rank(s) {late} for "
                        f"{self.timeout_s} s (this is TP rank {self.rank})"
                    )
                for key, mask in events:
                    peer, sock = key.data, key.fileobj
                    try:
                        if mask & selectors.EVENT_WRITE and sent[peer] < size:
                            sent[peer] += sock.send(mine[sent[peer] :])
                        n = -1
                        if mask & selectors.EVENT_READ and got[peer] < size:
                            n = sock.recv_into(memoryview(inbox[peer])[got[peer] :])
                    except OSError as err:  # reset or broken pipe: the peer is gone
                        n, lost = 0, f" ({err})"
                    else:
                        lost = ""
                    if n == 0:
                        raise RuntimeError(
                            f"vLLM-CPU TP collective: TP rank {peer} closed its connection{lost} "
                            f"(this is TP rank {self.rank})"
                        )
                    if n > 0:
                        got[peer] += n
                    if sent[peer] == size and got[peer] == size:
                        self.selector.unregister(sock)
                        pending -= 1
                    elif sent[peer] == size:
                        self.selector.modify(sock, selectors.EVENT_READ, peer)
        finally:
            for sock in self.peers.values():
                try:
                    self.selector.unregister(sock)
                except (KeyError, ValueError):
                    pass
        flat = tensor.detach().view(-1)
        return [
            flat.view_as(tensor) if r == self.rank else torch.frombuffer(inbox[r], dtype=tensor.dtype).view_as(tensor)
            for r in range(self.world_size)
        ]

    def close(self) -> None:
        for sock in self.peers.values():
            sock.close()
        self.peers = {}
        self.selector.close()


def connect_mesh(cpu_group: Any, timeout_s: Optional[float]) -> Optional[TPSocketMesh]:
    """Collective over ``cpu_group`` (every rank calls it): a mesh when all of the group's ranks run on this host
    and reach each other over loopback, else None on every rank (the group keeps torch.distributed). Ranks
    exchange their listening ports over the group, connect to every lower rank and accept every higher one."""
    rank, world = dist.get_rank(cpu_group), dist.get_world_size(cpu_group)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(world)
    me = (socket.gethostname(), listener.getsockname()[1])
    everyone: list = [None] * world
    dist.all_gather_object(everyone, me, group=cpu_group)
    peers: dict[int, socket.socket] = {}
    reached = len({host for host, _ in everyone}) == 1
    if reached:
        try:
            for peer in range(rank):  # say who we are; the connection waits in the peer's listen backlog
                sock = socket.create_connection(("127.0.0.1", everyone[peer][1]), timeout=timeout_s)
                peers[peer] = sock
                sock.sendall(_RANK.pack(rank))
        except OSError as err:  # e.g. ranks with one host name in separate network namespaces
            reached = False
            logger.warning(
                "vLLM-CPU TP rank %d cannot reach its peers over loopback (%s): the TP group keeps torch.distributed",
                rank,
                err,
            )
    verdicts: list = [None] * world
    dist.all_gather_object(verdicts, reached, group=cpu_group)  # before anyone accepts: no one waits in vain
    try:
        if not all(verdicts):
            for sock in peers.values():
                sock.close()
            return None
        listener.settimeout(timeout_s)
        for _ in range(rank + 1, world):  # already connected (backlog): accept returns at once
            sock, _ = listener.accept()
            sock.settimeout(timeout_s)
            peers[_RANK.unpack(_recv_exact(sock, _RANK.size))[0]] = sock
    finally:
        listener.close()
    for sock in peers.values():
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
    return TPSocketMesh(rank, peers, world, timeout_s)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise RuntimeError("vLLM-CPU TP mesh: a peer closed its connection during the handshake")
        data += chunk
    return data


def mesh_tp_groups() -> bool:
    """Every vLLM-CPU engine this process builds from now on reduces its TP group over a socket mesh where vLLM fell
    back to ``torch.distributed``, with the world group's timeout (the one the rollout gives vLLM's groups:
    verl/workers/rollout/tp_group.py): the CPU worker's ``init_device`` (where vLLM creates or reuses its groups, on
    every rank of the group at once) ends with ``use_socket_mesh_for_tp``, its ``shutdown`` starts with
    ``close_socket_mesh_for_tp`` (in-process, vLLM keeps its groups for the next engine). False when this vLLM has no
    CPU worker."""
    try:
        from vllm.v1.worker.cpu_worker import CPUWorker
    except ImportError:
        return False
    if getattr(CPUWorker.init_device, "luffy_socket_mesh", False):
        return True
    original_init_device, original_shutdown = CPUWorker.init_device, CPUWorker.shutdown

    def init_device(self, *args, **kwargs):
        result = original_init_device(self, *args, **kwargs)
        use_socket_mesh_for_tp(_world_timeout_s())
        return result

    def shutdown(self, *args, **kwargs):
        close_socket_mesh_for_tp()
        return original_shutdown(self, *args, **kwargs)

    init_device.luffy_socket_mesh = True
    CPUWorker.init_device, CPUWorker.shutdown = init_device, shutdown
    return True


def _world_timeout_s() -> Optional[float]:
    if not dist.is_initialized():
        return None
    from verl.workers.rollout.tp_group import group_timeout_s

    return group_timeout_s(dist.group.WORLD)


def use_socket_mesh_for_tp(timeout_s: Optional[float]) -> bool:
    """Once the TP group exists: move its reductions to a socket mesh when vLLM fell back to ``torch.distributed``
    for them; True when it did. Every rank of the TP group must call it."""
    try:
        from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
        from vllm.distributed.parallel_state import get_tp_group
    except ImportError:
        return False
    coordinator = get_tp_group()
    comm = getattr(coordinator, "device_communicator", None)
    if coordinator.world_size < 2 or not isinstance(comm, CpuCommunicator) or comm.dist_module is not dist:
        return False  # one rank, or vLLM's shared-memory path (the same on every rank of one machine kind)
    mesh = connect_mesh(coordinator.cpu_group, timeout_s)
    if mesh is None:
        return False
    mesh.group = comm.device_group
    comm.dist_module = mesh
    logger.debug("vLLM-CPU TP group of %d ranks reduces over a socket mesh", coordinator.world_size)
    return True


def close_socket_mesh_for_tp() -> None:
    """Before the engine's teardown: close this rank's mesh (vLLM destroys its groups with the engine)."""
    state = sys.modules.get("vllm.distributed.parallel_state")
    comm = getattr(getattr(state, "_TP", None), "device_communicator", None)
    if isinstance(getattr(comm, "dist_module", None), TPSocketMesh):
        comm.dist_module.close()
        comm.dist_module = dist
