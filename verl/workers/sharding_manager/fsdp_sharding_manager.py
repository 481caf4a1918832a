"""The hybrid engine's weight push and its switch from training to generation and back.

Two steps, in this order before every generation (the driver names the first as its ``update_weights``
stage, the worker's method of that name):

* ``sync_weights`` streams the actor's current weights (FSDP2 DTensors gathered one tensor at a time, in
  byte-bounded buckets) into the rollout engine, waking its weights first. Every rank must call it
  together: the gathers are collectives.
* entering the manager (``with manager:``) wakes the engine's cache and swaps in the generation RNG
  stream; leaving saves that stream, restores the trainer's RNG, puts the engine to sleep (GPU) and the
  module back into train mode. Entering without a push since the last generation is refused, so no
  generation runs on stale (or, after a deep sleep, discarded) weights. A generation that declares the next one
  its continuation (``hold_weights``: the validation chunks of one validation, no update between them) leaves
  the engine awake with its weights, and the next generation needs no push.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch
from torch import nn

from verl.utils.fsdp_gather import iter_full_param_buckets
from verl.utils.fsdp_utils import DTypeLike, iter_buckets, iter_full_params, to_torch_dtype
from verl.utils.moe_layout import checkpoint_buckets, checkpoint_named, model_layout
from verl.workers.rollout.base import BaseRollout

logger = logging.getLogger(__name__)

WEIGHT_SYNC_METRIC = "timing_s/weight_sync"
# meta_info key of a generation request (set by the driver's validation, luffy_pool/trainer/mix_trainer.py; read by
# the worker's generate, luffy_pool/workers/mix_fsdp_worker.py): True = another generation on the same weights
# follows, so the engine stays awake and keeps them (a level-2 sleep would drop them and force a push per chunk).
HOLD_WEIGHTS_KEY = "hold_engine_weights"


def is_engine_owner(rank: int, tp_size: int) -> bool:
    """Whether ``rank`` feeds its TP group's engine when one engine serves the whole group."""
    return rank % tp_size == 0


def _get_rng_states(include_cuda: bool) -> dict:
    states = {"cpu": torch.get_rng_state()}
    if include_cuda:
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"])


class FSDPShardingManager:
    """Weight push (``sync_weights``), then RNG + memory choreography around one generation phase (the context).

    Args:
        module: the actor (``fully_shard``-ed HF model or a plain ``nn.Module``).
        rollout: this rank's engine, or None on ranks that only take part in the gathers (when all
            ranks of a TP group feed one engine, see ``is_engine_owner``).
        bucket_bytes: upper bound of one ``update_weights`` call.
        sync_dtype: cast weights to this dtype before gathering (e.g. bf16 for a bf16 engine).
        rank, world_size, tp_size: placement; ranks of one TP group are consecutive, so the
            data-parallel rank is ``rank // tp_size`` and a TP group shares one sampling seed.
        base_seed: the generation RNG of data-parallel rank d starts from ``base_seed + d``
            (LUFFY: 1000 + dp rank) and continues across steps.
    """

    sleep_after_generation = True  # the colocated engine gives its GPU memory back to the actor between steps

    def __init__(
        self,
        module: nn.Module,
        rollout: Optional[BaseRollout],
        bucket_bytes: int = 256 * 2**20,
        sync_dtype: DTypeLike = None,
        rank: int = 0,
        world_size: int = 1,
        tp_size: int = 1,
        base_seed: int = 1000,
        device: str = "cpu",
        packed_gather: bool = True,
    ) -> None:
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        if tp_size < 1 or world_size % tp_size:
            raise ValueError(f"tp_size={tp_size} must divide world_size={world_size}")
        self.module = module
        self.rollout = rollout
        self.bucket_bytes = bucket_bytes
        self.packed_gather = packed_gather
        self.sync_dtype = to_torch_dtype(sync_dtype)
        self.rank, self.world_size, self.tp_size = rank, world_size, tp_size
        self.dp_rank = rank // tp_size
        self.device = device
        self.last_sync_s: Optional[float] = None
        self.last_sync_buckets = 0
        self._trainer_rng: Optional[dict] = None
        self._pushed = False  # weights pushed since the last generation
        self.hold_weights = False  # the generation now entered keeps the engine awake for the next (hold())
        self._cuda_rng = device == "cuda"
        self._generation_rng = self._initial_generation_rng(base_seed + self.dp_rank)
        if module is not None and rollout is not None and world_size == 1 and hasattr(rollout, "set_weight_source"):
            # Lets a rebuilt engine re-read the weights; only safe without cross-rank collectives.
            rollout.set_weight_source(
                lambda: checkpoint_named(iter_full_params(self.module, self.sync_dtype), model_layout(self.module))
            )

    def _initial_generation_rng(self, seed: int) -> dict:
        saved = _get_rng_states(self._cuda_rng)
        torch.manual_seed(seed)  # seeds the CPU and every CUDA generator
        states = _get_rng_states(self._cuda_rng)
        _set_rng_states(saved)
        return states

    @property
    def owns_engine(self) -> bool:
        return self.rollout is not None

    @property
    def metrics(self) -> dict[str, float]:
        return {} if self.last_sync_s is None else {WEIGHT_SYNC_METRIC: self.last_sync_s}

    def sync_weights(self) -> float:
        """Stream all weights into the engine (every rank gathers; owners push); returns seconds."""
        start = time.perf_counter()
        if self.rollout is not None:
            getattr(self.rollout, "wake_up_weights", self.rollout.wake_up)()
        buckets = 0
        for bucket in self._weight_buckets():
            if self.rollout is not None:
                self.rollout.update_weights(bucket)
            buckets += 1
        if self.rollout is not None:
            self.rollout.after_weight_update()
        self.last_sync_s = time.perf_counter() - start
        self.last_sync_buckets = buckets
        self._pushed = True
        return self.last_sync_s

    def _weight_buckets(self):
        """The full weights in buckets, gathered from this rank's FSDP shards (every rank takes part), under the
        checkpoint's names (fused MoE experts split per expert: verl/utils/moe_layout.py)."""
        if self.packed_gather:  # one collective per bucket (fsdp_gather.py)
            buckets = iter_full_param_buckets(self.module, self.sync_dtype, self.bucket_bytes)
        else:
            buckets = iter_buckets(iter_full_params(self.module, self.sync_dtype), self.bucket_bytes)
        return checkpoint_buckets(self.module, buckets)

    def __enter__(self) -> "FSDPShardingManager":
        if not self._pushed:
            raise RuntimeError(
                "generation without a weight push since the last one: call sync_weights() first "
                "(the driver's update_weights stage)"
            )
        if self.rollout is not None:
            self.rollout.wake_up()
        self._trainer_rng = _get_rng_states(self._cuda_rng)
        _set_rng_states(self._generation_rng)
        return self

    def hold(self, hold_weights: bool) -> "FSDPShardingManager":
        """The context for a generation after which another on the same weights follows (``hold_weights=True``):
        on exit the engine neither sleeps nor needs a new push. A failed generation releases as usual."""
        self.hold_weights = bool(hold_weights)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        hold, self.hold_weights = self.hold_weights and exc_type is None, False
        if not hold:
            self._pushed = False  # the actor trains before the next generation
        self._generation_rng = _get_rng_states(self._cuda_rng)
        if self._trainer_rng is not None:
            _set_rng_states(self._trainer_rng)
            self._trainer_rng = None
        if self.rollout is not None and self.sleep_after_generation and not hold:
            self.rollout.sleep()
        if self.module is not None:  # None on a split engine's rank (collective_sync.SplitRolloutManager)
            self.module.train()
        if self.device == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()
