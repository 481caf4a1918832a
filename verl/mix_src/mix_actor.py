"""LUFFY's module path ``verl.mix_src.mix_actor``: the mixed-policy actor (``luffy_pool.workers.mix_actor``)."""

from luffy_pool.workers.mix_actor import MIXDataParallelPPOActor

__all__ = ["MIXDataParallelPPOActor"]
