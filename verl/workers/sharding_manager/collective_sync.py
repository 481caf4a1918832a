"""Split placement's weight push (``actor_rollout_ref.hybrid_engine=False``): actor -> rollout engines over a
collective group of their own.

With the hybrid engine each rank pushes the actor's weights into its own engine in-process
(``fsdp_sharding_manager``). On split resources the engines live in another Ray worker group, so the weights
cross processes: every actor rank takes part in gathering the FSDP shards into full tensors (the same
byte-bounded buckets, ``iter_full_param_buckets``), and the actor's rank 0 broadcasts each bucket to the rollout
ranks over a process group that joins exactly those 1 + R processes (gloo on CPU, NCCL on GPU; built from a
``TCPStore`` at an address the driver hands both groups, since each group's default process group is its own).
Only rank 0 sends: the other actor ranks hold the same full tensors after the gather, so making them members
would only copy the bytes again.

The store's server is bound once, on a port the OS picks (``listen``: port 0), and kept open until the group is
built from it: picking a free port by binding, closing and binding again later leaves a window in which another
process on a shared node can take it. The group gets the run's ``actor_rollout_ref.nccl_timeout`` (gloo's
``timeout`` argument, NCCL's ``Options._timeout``), not torch's default (10 min for NCCL).

Wire format per bucket: an int64 header length, the pickled header (name, shape, dtype, bytes of each tensor;
None ends the push), then the bucket's tensors as one flat uint8 buffer, so a bucket costs three broadcasts
whatever its tensor count.
"""

from __future__ import annotations

import datetime
import pickle
from typing import Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from verl.workers.sharding_manager.fsdp_sharding_manager import FSDPShardingManager

SENDER = 0  # the actor's rank 0 is rank 0 of the weight group; rollout rank r is 1 + r


def node_host() -> str:
    """This node's IP (what the other members connect to); outside Ray (tests) the loopback."""
    import sys

    ray = sys.modules.get("ray")  # a worker has imported it
    return ray.util.get_node_ip_address() if ray is not None and ray.is_initialized() else "127.0.0.1"


def listen(timeout_s: float) -> tuple[str, int, dist.TCPStore]:
    """The weight group's store server (on the actor's rank 0): ``(host, port, store)``, bound once on a port the OS
    picks; it serves the members that ``connect`` until the group is built from it (``WeightGroup.join``)."""
    host = node_host()
    store = dist.TCPStore(host, 0, None, is_master=True, timeout=_timedelta(timeout_s), wait_for_workers=False)
    return host, int(store.port), store


def connect(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A member's client of the store ``listen`` opened on the actor's rank 0."""
    return dist.TCPStore(host, int(port), None, is_master=False, timeout=_timedelta(timeout_s))


def new_process_group(store, rank: int, size: int, device: str, timeout_s: float):
    """The broadcast group over ``store`` with the collective timeout ``timeout_s`` (seconds): NCCL on ``cuda``,
    gloo otherwise. A group built by its constructor gets no timeout from the run's world group."""
    timeout = _timedelta(timeout_s)
    prefixed = dist.PrefixStore("weights", store)
    if device == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout  # the constructor's default is torch's 10 min, whatever the world group has
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


class WeightGroup:
    """One member of the actor -> engines broadcast group (``rank`` 0 sends, the others receive)."""

    def __init__(self, pg, rank: int, size: int, device: torch.device) -> None:
        self.pg, self.rank, self.size, self.device = pg, rank, size, device

    @classmethod
    def join(cls, store, rank: int, size: int, device: str, timeout_s: float) -> "WeightGroup":
        """Rendezvous of all ``size`` members on ``store`` (rank 0: ``listen``'s, the others: ``connect``'s); blocks
        until every one joined, at most ``timeout_s``; ``device`` picks gloo or NCCL."""
        store.set(f"joined/{rank}", "1")
        try:  # met here for both backends (NCCL alone would meet at its first broadcast)
            store.wait([f"joined/{r}" for r in range(size)], _timedelta(timeout_s))
        except dist.DistStoreError:
            missing = [r for r in range(size) if not store.check([f"joined/{r}"])]
            raise RuntimeError(
                f"weight group: ranks {missing} of {size} did not join within "
                f"actor_rollout_ref.nccl_timeout={timeout_s} s"
            ) from None
        pg = new_process_group(store, rank, size, device, timeout_s)
        dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        return cls(pg, rank, size, dev)

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        opts = dist.BroadcastOptions()
        opts.rootRank = SENDER
        self.pg.broadcast([tensor], opts).wait()
        return tensor

    def _send_header(self, header) -> None:
        raw = torch.frombuffer(bytearray(pickle.dumps(header)), dtype=torch.uint8).to(self.device)
        self._broadcast(torch.tensor([raw.numel()], dtype=torch.int64, device=self.device))
        self._broadcast(raw)

    def _recv_header(self):
        length = self._broadcast(torch.zeros(1, dtype=torch.int64, device=self.device))
        raw = self._broadcast(torch.empty(int(length.item()), dtype=torch.uint8, device=self.device))
        return pickle.loads(raw.cpu().numpy().tobytes())  # the header comes from the actor's rank 0 of this run

    def send(self, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> int:
        """Broadcast every bucket, then the end mark; returns the bucket count. Sender only."""
        if self.rank != SENDER:
            raise RuntimeError(f"weight group rank {self.rank} cannot send (rank {SENDER} is the actor's rank 0)")
        count = 0
        for bucket in buckets:
            flat = [t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket]
            self._send_header(
                [(name, tuple(t.shape), str(t.dtype).split(".")[-1], f.numel()) for (name, t), f in zip(bucket, flat)]
            )
            self._broadcast(torch.cat(flat).to(self.device) if flat else torch.empty(0, dtype=torch.uint8))
            count += 1
        self._send_header(None)
        return count

    def receive(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The buckets rank 0 sends, as ``(name, tensor)`` lists, until its end mark. Receivers only."""
        while True:
            header = self._recv_header()
            if header is None:
                return
            buf = self._broadcast(torch.empty(sum(h[3] for h in header), dtype=torch.uint8, device=self.device))
            out, offset = [], 0
            for name, shape, dtype, nbytes in header:
                # clone: a slice may start at an offset the target dtype's view refuses (mixed dtypes)
                out.append((name, buf[offset : offset + nbytes].clone().view(getattr(torch, dtype)).reshape(shape)))
                offset += nbytes
            yield out


class SplitRolloutManager(FSDPShardingManager):
    """The rollout rank's side of the split engine: the same RNG / sleep choreography around a generation as the
    hybrid manager, but ``sync_weights`` receives the actor's buckets over the weight group instead of gathering
    them from a local FSDP module (the rollout ranks hold none). The engine never sleeps: its GPUs are its own, so a
    sleep would free nothing the actor could use and each wake-up would map the KV cache again (and drop the prefix
    cache) between generations that follow each other (verl's one_step_off_policy manager does not sleep either).
    Its wake-ups are then no-ops (it starts awake); the memory plan's split rollout phase counts the engine awake with
    the receive bucket."""

    sleep_after_generation = False

    def __init__(self, rollout, group: Optional[WeightGroup] = None, **kwargs) -> None:
        super().__init__(None, rollout, **kwargs)
        self.group = group

    def sync_weights(self) -> float:
        if self.group is None:
            raise RuntimeError("the rollout ranks have not joined the weight group (the launcher's join_weight_group)")
        return super().sync_weights()

    def _weight_buckets(self):
        """The actor's buckets, received over the weight group (this rank holds no FSDP module)."""
        return self.group.receive()
