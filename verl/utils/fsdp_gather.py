"""Full weights of an FSDP2 module in byte-bounded buckets, one collective per bucket.

``DTensor.full_tensor()`` per parameter costs one all-gather each; on gloo (CPU) a collective has a
fixed cost of a few milliseconds, so a weight sync of a small model is dominated by the count of
collectives, not bytes (measured: 65 ms for the tiny model's 27 tensors over 2 ranks). Here the local
shards of a bucket are padded to FSDP2's chunk size (``ceil(dim0 / world)`` rows, as ``torch.chunk``
splits), packed into one flat buffer, all-gathered once, and cut back into full tensors.

Only parameters sharded as ``Shard(0)`` along one mesh dimension take the packed path (what
``fully_shard`` produces: a 1-D FSDP mesh, or the ``fsdp`` dimension of a 2-D HSDP mesh, whose other
dimension replicates, so the gather stays inside the shard group); anything else (plain tensors, other
placements) is gathered on its own, so the result always equals ``iter_full_params``.
"""

from __future__ import annotations

import math
from typing import Iterator, Optional

import torch
from torch import nn

from verl.utils.fsdp_mesh import shard_mesh_dim
from verl.utils.fsdp_utils import DTypeLike, _full_tensor, clean_param_name, tensor_nbytes, to_torch_dtype


def _packable(tensor: torch.Tensor):
    """(mesh, shard mesh dim) when the DTensor is ``Shard(0)`` along one mesh dim (replicated along any
    other) and lives on the mesh's device, else None."""
    dim = shard_mesh_dim(tensor)
    if dim is None or tensor.device.type != tensor.device_mesh.device_type or tensor.dim() == 0:
        return None
    return tensor.device_mesh, dim


def _gather_packed(
    items: list[tuple[str, torch.Tensor]], mesh, mesh_dim: int, dtype: Optional[torch.dtype]
) -> list[tuple[str, torch.Tensor]]:
    """All-gather the Shard(0) DTensors of ``items`` over ``mesh_dim`` with one collective; full tensors in
    item order."""
    world = mesh.size(mesh_dim)
    group = mesh.get_group(mesh_dim)
    layouts, pieces = [], []
    for name, tensor in items:
        local = tensor.to_local()
        if dtype is not None and local.dtype != dtype:
            local = local.to(dtype)
        rows = tensor.shape[0]
        chunk = math.ceil(rows / world)
        per_row = math.prod(tensor.shape[1:])
        padded = local.new_zeros((chunk,) + tuple(tensor.shape[1:]))
        padded[: local.shape[0]] = local
        pieces.append(padded.reshape(-1))
        layouts.append((name, tuple(tensor.shape), chunk, per_row))
    import torch.distributed._functional_collectives as funcol

    # all_gather_single replaced all_gather_tensor (deprecated, warned on every call); older torch has only the latter.
    all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    send = torch.cat(pieces)
    # The functional collective DTensor.full_tensor uses too (same group registry, same wait semantics).
    recv = all_gather(send, gather_dim=0, group=group)
    if hasattr(recv, "wait"):
        recv = recv.wait()
    per_rank = recv.view(world, -1)
    out, offset = [], 0
    for name, shape, chunk, per_row in layouts:
        size = chunk * per_row
        rows = per_rank[:, offset : offset + size].reshape((world * chunk,) + shape[1:])
        out.append((name, rows[: shape[0]].clone()))
        offset += size
    return out


def iter_full_param_buckets(
    module: nn.Module, dtype: DTypeLike, bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of ``(HF name, full tensor)`` of at most ``bucket_bytes`` (full size; a larger tensor
    travels alone), in state_dict order, tied weights once. Every rank must iterate."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    dtype = to_torch_dtype(dtype)
    seen: set[int] = set()
    pending: list[tuple[str, torch.Tensor]] = []
    pending_bytes = 0

    def flush() -> list[tuple[str, torch.Tensor]]:
        packed = [(n, t) for n, t in pending if _packable(t) is not None]
        meshes = {(id(_packable(t)[0]), _packable(t)[1]) for _, t in packed}
        full: dict[str, torch.Tensor] = {}
        if packed and len(meshes) == 1:
            full.update(_gather_packed(packed, *_packable(packed[0][1]), dtype))
        for name, tensor in pending:
            if name not in full:
                full[name] = _full_tensor(tensor, dtype)
        return [(name, full[name]) for name, _ in pending]

    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=True).items():
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            tensor = tensor.detach()
            nbytes = tensor_nbytes(tensor) if dtype is None else tensor.numel() * dtype.itemsize
            if pending and pending_bytes + nbytes > bucket_bytes:
                yield flush()
                pending, pending_bytes = [], 0
            pending.append((clean_param_name(name), tensor))
            pending_bytes += nbytes
        if pending:
            yield flush()
