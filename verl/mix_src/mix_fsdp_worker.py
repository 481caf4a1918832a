"""LUFFY's module path ``verl.mix_src.mix_fsdp_worker``: the FSDP actor/rollout/ref worker
(``luffy_pool.workers.mix_fsdp_worker``)."""

from luffy_pool.workers.mix_fsdp_worker import MIXActorRolloutRefWorker

__all__ = ["MIXActorRolloutRefWorker"]
