"""Sharding managers: move the trainer's (FSDP-sharded) weights into a rollout engine around generation."""

from verl.workers.sharding_manager.fsdp_sharding_manager import FSDPShardingManager, is_engine_owner

__all__ = ["FSDPShardingManager", "is_engine_owner"]
