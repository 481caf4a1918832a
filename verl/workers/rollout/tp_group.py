"""Rollout tensor parallelism inside the hybrid engine: who shares an engine, and what it generates.

With ``rollout.tensor_model_parallel_size = t`` each run of t consecutive ranks forms one vLLM engine
(``external_launcher``: every rank of the TP group holds a shard and all of them must run the same
schedule). The driver still hands each rank its own chunk of prompts (``DP_COMPUTE_PROTO``), so before
generation the TP group all-gathers its chunks (in TP-rank order), every rank generates the whole group's
prompts with the seed of its data-parallel rank, and afterwards each rank keeps the rows of its own
prompts. With t = 1 everything here is the identity. Weights: every TP rank pushes the full tensors to
its engine, which keeps its own shard (``FSDPShardingManager`` with an engine on every rank).

Timeouts (``actor_rollout_ref.nccl_timeout``): the TP groups are created with it, and the groups vLLM makes
for itself inside the worker (its world, TP, PP, ... coordinators, device and CPU groups) get the world
group's timeout once the engine is built (``apply_world_timeout_to_vllm_groups``); torch would give them its
10-minute NCCL default.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch


@dataclasses.dataclass(frozen=True)
class TPLayout:
    """Place of ``rank`` among ``world_size`` ranks cut into TP groups of ``tp_size`` consecutive ranks."""

    rank: int
    world_size: int
    tp_size: int

    def __post_init__(self) -> None:
        if self.tp_size < 1 or self.world_size % self.tp_size:
            raise ValueError(
                f"rollout.tensor_model_parallel_size={self.tp_size} must divide the {self.world_size} "
                "ranks of the worker group (trainer.nnodes x trainer.n_gpus_per_node)"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp_size

    @property
    def group_ranks(self) -> list[int]:
        start = self.dp_rank * self.tp_size
        return list(range(start, start + self.tp_size))

    def describe(self) -> str:
        return f"{self.dp_size} DP group(s) x TP {self.tp_size}"


def build_tp_group(layout: TPLayout, timeout_s: Optional[float] = None) -> Any:
    """This rank's TP process group (None for TP 1). Every rank creates every group: ``new_group`` is
    collective over the whole world, so all ranks must call it for each group in the same order.
    ``timeout_s``: the groups' collective timeout (None: torch's default)."""
    if layout.tp_size == 1:
        return None
    import datetime

    import torch.distributed as dist

    timeout = None if timeout_s is None else datetime.timedelta(seconds=float(timeout_s))
    mine = None
    for dp in range(layout.dp_size):
        ranks = list(range(dp * layout.tp_size, (dp + 1) * layout.tp_size))
        group = dist.new_group(ranks, timeout=timeout)
        if layout.rank in ranks:
            mine = group
    return mine


def group_timeout_s(group: Any) -> Optional[float]:
    """The collective timeout (seconds) a process group's backend was given, None when it cannot be read."""
    try:
        backend = group._get_backend(group._device_types[0])
        return backend.options._timeout.total_seconds()
    except (AttributeError, IndexError, RuntimeError):
        return None


def vllm_process_groups() -> list[Any]:
    """Every process group vLLM's parallel state holds in this process (device and CPU group of each
    coordinator that exists); empty when vLLM was never imported here."""
    import sys

    state = sys.modules.get("vllm.distributed.parallel_state")
    if state is None:
        return []
    groups = []
    for value in list(vars(state).values()):
        if isinstance(value, state.GroupCoordinator):
            groups += [
                g for g in (getattr(value, "device_group", None), getattr(value, "cpu_group", None)) if g is not None
            ]
    return groups


def apply_world_timeout_to_vllm_groups() -> Optional[float]:
    """Give vLLM's process groups the world group's timeout (the worker's ``nccl_timeout``); returns it."""
    import torch.distributed as dist

    from verl.utils.fsdp_mesh import set_group_timeout

    if not dist.is_initialized():
        return None
    timeout_s = group_timeout_s(dist.group.WORLD)
    if timeout_s is None:
        import logging

        logging.getLogger(__name__).warning(
            "the world group's timeout cannot be read: vLLM's process groups keep torch's default timeout"
        )
    set_group_timeout(vllm_process_groups(), timeout_s)
    return timeout_s


def gather_rows(tensors: dict[str, torch.Tensor], group: Any, tp_size: int) -> dict[str, torch.Tensor]:
    """Every TP rank's rows concatenated in TP-rank order (the same keys on every rank)."""
    import torch.distributed as dist

    parts: list[Optional[dict]] = [None] * tp_size
    dist.all_gather_object(parts, {k: v.detach().cpu() for k, v in tensors.items()}, group=group)
    keys = list(parts[0])
    for tp_rank, part in enumerate(parts):
        if list(part) != keys:
            raise RuntimeError(f"TP rank {tp_rank} sent batch keys {sorted(part)}, TP rank 0 sent {sorted(keys)}")
    return {k: torch.cat([part[k] for part in parts]) for k in keys}


def split_rows(tensors: dict[str, torch.Tensor], tp_size: int, tp_rank: int) -> dict[str, torch.Tensor]:
    """TP rank ``tp_rank``'s share of rows generated for the whole TP group (inverse of ``gather_rows``)."""
    out = {}
    for k, v in tensors.items():
        if v.shape[0] % tp_size:
            raise RuntimeError(f"output '{k}' has {v.shape[0]} rows, not divisible by TP size {tp_size}")
        out[k] = v.chunk(tp_size)[tp_rank]
    return out


class TPGeneration:
    """Gather -> generate -> split for one rank of a TP group (identity for TP 1)."""

    def __init__(self, layout: TPLayout, group: Any = None) -> None:
        self.layout = layout
        self.group = group

    @classmethod
    def create(cls, rank: int, world_size: int, tp_size: int, timeout_s: Optional[float] = None) -> "TPGeneration":
        layout = TPLayout(rank, world_size, tp_size)
        return cls(layout, build_tp_group(layout, timeout_s))

    def run(
        self, tensors: dict[str, torch.Tensor], generate: Callable[[dict[str, torch.Tensor]], Any]
    ) -> tuple[dict[str, torch.Tensor], dict]:
        """``generate(batch)`` returns an object with ``tensors`` and ``meta_info`` (a ``RolloutBatch``);
        returns this rank's rows of its tensors, and its meta_info."""
        tp = self.layout.tp_size
        if tp == 1:
            out = generate(tensors)
            return dict(out.tensors), dict(out.meta_info)
        out = generate(gather_rows(tensors, self.group, tp))
        return split_rows(dict(out.tensors), tp, self.layout.tp_rank), dict(out.meta_info)
