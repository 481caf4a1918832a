"""Device meshes of the actor: FSDP (1-D) or hybrid sharding (2-D HSDP), and Ulysses sequence-parallel groups.

``fsdp_config.fsdp_size`` (LUFFY/verl key) sets how many ranks share one copy of the model: -1 or the world
size shards over all ranks (plain FSDP, mesh ``("fsdp",)``); a divisor ``f`` of the world size gives a
``(world / f, f)`` mesh named ``("ddp", "fsdp")``: ``fully_shard`` then shards within each group of ``f``
consecutive ranks and replicates across groups (gradients: reduce-scatter inside a group, all-reduce
across). Shards are larger, but the parameter all-gathers stay inside a group (one node, NVLink).

``ulysses_sequence_parallel_size`` groups consecutive ranks into sequence-parallel groups; the data-parallel
degree of the batch is ``world / sp`` (mesh ``("dp", "sp")``, as verl names it).

``timeout_s`` (``actor_rollout_ref.nccl_timeout``): the sub-groups a mesh creates (HSDP's two dimensions, SP's)
take it too; torch gives them its own default (10 min NCCL, 30 min gloo), not the world group's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterable, Optional

FSDP_SIZE_KEY = "actor_rollout_ref.actor.fsdp_config.fsdp_size"


def fsdp_mesh_shape(world_size: int, fsdp_size: Optional[int]) -> tuple[int, ...]:
    """``(world,)`` for plain FSDP (``fsdp_size`` -1, None or the world size), else ``(world // f, f)``."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if fsdp_size is None or fsdp_size == -1 or fsdp_size == world_size:
        return (world_size,)
    if fsdp_size < 1 or world_size % fsdp_size:
        raise ValueError(
            f"'{FSDP_SIZE_KEY}'={fsdp_size} must be -1 (all ranks) or a positive divisor of the world size {world_size}"
        )
    return (world_size // fsdp_size, fsdp_size)


def set_group_timeout(groups: Iterable[Any], timeout_s: Optional[float]) -> None:
    """Give each process group of ``groups`` (None and the world group skipped: the world has its own from
    ``init_process_group``) the collective timeout ``timeout_s``; nothing when ``timeout_s`` is None."""
    if timeout_s is None:
        return
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    for group in groups:
        if group is not None and group is not dist.group.WORLD:
            _set_pg_timeout(timedelta(seconds=float(timeout_s)), group)


def _mesh_with_timeout(device: str, shape: tuple[int, ...], names: tuple[str, ...], timeout_s: Optional[float]):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device, shape, mesh_dim_names=names)
    set_group_timeout((mesh.get_group(name) for name in names), timeout_s)
    return mesh


def build_fsdp_mesh(device: str, world_size: int, fsdp_size: Optional[int] = -1, timeout_s: Optional[float] = None):
    """The mesh ``fully_shard`` takes: 1-D ``("fsdp",)`` or 2-D ``("ddp", "fsdp")`` for HSDP."""
    shape = fsdp_mesh_shape(world_size, fsdp_size)
    names = ("fsdp",) if len(shape) == 1 else ("ddp", "fsdp")
    return _mesh_with_timeout(device, shape, names, timeout_s)


def build_ulysses_mesh(device: str, world_size: int, sp_size: int, timeout_s: Optional[float] = None):
    """``("dp", "sp")`` mesh: SP groups of ``sp_size`` consecutive ranks; None when ``sp_size`` is 1."""
    if sp_size < 1 or world_size % sp_size:
        raise ValueError(
            f"'actor_rollout_ref.actor.ulysses_sequence_parallel_size'={sp_size} must divide the "
            f"world size {world_size}"
        )
    if sp_size == 1:
        return None
    return _mesh_with_timeout(device, (world_size // sp_size, sp_size), ("dp", "sp"), timeout_s)


def shard_mesh_dim(tensor) -> Optional[int]:
    """For a DTensor sharded on dim 0 along exactly one mesh dimension and replicated along the others
    (what ``fully_shard`` makes, FSDP or HSDP): that mesh dimension. None for anything else."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(tensor, DTensor):
        return None
    shard_dims = [i for i, p in enumerate(tensor.placements) if type(p) is Shard and p.dim == 0]
    others_replicated = all(type(p) is Replicate for i, p in enumerate(tensor.placements) if i not in shard_dims)
    if len(shard_dims) != 1 or not others_replicated:
        return None
    return shard_dims[0]
