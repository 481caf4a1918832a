"""The worker methods of the split engine's weight push (``actor_rollout_ref.hybrid_engine=False``).

The driver asks the actor's rank 0 for an address (``weight_group_address``), then has the actor group and the
rollout group join one broadcast group together (``join_weight_group``: actor rank 0 is its rank 0, rollout rank r
its rank 1 + r; the other actor ranks stay out). Each push is ``send_weights`` on every actor rank (all gather the
FSDP shards; rank 0 broadcasts) called together with ``receive_weights`` on every rollout rank. The calls return
Ray futures (``blocking=False``) so the driver can start both sides before waiting on either:
``verl.workers.sharding_manager.collective_sync`` has the wire format.
"""

from __future__ import annotations

import time

from verl.single_controller.base.decorator import Dispatch, register


class SplitWeightsMixin:
    """Adds the split weight push to ``ActorRolloutRefWorker`` (roles actor / actor_ref send, rollout receives)."""

    weight_group = None
    _weight_store = None  # actor rank 0: the store ``weight_group_address`` opened, until ``join_weight_group``

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def weight_group_address(self) -> tuple:
        """(host, port) of the weight group's store, which this rank (actor rank 0) opens here and keeps listening:
        the port is bound once, so no other process can take it before the members join."""
        from verl.workers.sharding_manager.collective_sync import listen

        host, port, self._weight_store = listen(self.sections.nccl_timeout)
        return host, port

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_group(self, host: str, port: int, rollout_ranks: int) -> bool:
        """Join the actor -> engines broadcast group; returns whether this rank is a member."""
        from verl.workers.sharding_manager.collective_sync import WeightGroup, connect

        timeout_s = self.sections.nccl_timeout
        if self._is_rollout:
            group_rank, store = 1 + self.rank, connect(host, port, timeout_s)
        elif self.rank == 0:
            if self._weight_store is None:
                raise RuntimeError(
                    "join_weight_group on the actor's rank 0 before weight_group_address opened its store"
                )
            group_rank, store, self._weight_store = 0, self._weight_store, None
        else:
            return False
        self.weight_group = WeightGroup.join(store, group_rank, 1 + int(rollout_ranks), self.device, timeout_s)
        if self._is_rollout:
            self.sharding_manager.group = self.weight_group
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self) -> dict:
        """Gather the actor's full weights bucket by bucket (every actor rank: collectives); rank 0 broadcasts each
        to the engines. Returns this rank's seconds and bucket count."""
        from verl.utils.fsdp_gather import iter_full_param_buckets
        from verl.utils.fsdp_utils import iter_buckets, iter_full_params
        from verl.utils.moe_layout import checkpoint_buckets
        from verl.utils.pipeline_parallel import pipeline_of

        if not self._is_actor or self._is_rollout:
            raise RuntimeError(f"send_weights called on a worker with role {self.role!r} (the split actor sends)")
        t0 = time.perf_counter()
        rcfg = self.sections.rollout
        dtype, size = self._param_dtype(self.sections.actor.fsdp_config), int(rcfg.weight_sync_bucket_mb) << 20
        pipe = pipeline_of(self.actor_module)
        if pipe is not None:  # pipeline stages: every stage's tensors reach rank 0 (pipeline_actor.py)
            buckets = iter_buckets(pipe.full_weights.named_tensors(dtype), size)
        elif rcfg.weight_sync_packed:
            buckets = iter_full_param_buckets(self.actor_module, dtype, size)
        else:
            buckets = iter_buckets(iter_full_params(self.actor_module, dtype), size)
        buckets = checkpoint_buckets(self.actor_module, buckets)  # per-expert MoE names, as engines load them
        if self.weight_group is not None:
            count = self.weight_group.send(buckets)
        else:
            count = sum(1 for _ in buckets)  # this rank's part of the gathers
        return {"seconds": time.perf_counter() - t0, "buckets": count}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self) -> dict:
        """Receive the actor's buckets into this rank's engine (the split engine's push before a generation)."""
        from verl.workers.sharding_manager.fsdp_sharding_manager import WEIGHT_SYNC_METRIC

        if not self._engine_only:
            raise RuntimeError(f"receive_weights called on a worker with role {self.role!r} (split engines receive)")
        return {WEIGHT_SYNC_METRIC: self.sharding_manager.sync_weights()}
