"""Global gradient-norm clipping whose collective runs on the compute device (FSDP2 with param_offload).

With ``fsdp_config.param_offload=True`` FSDP2 keeps the sharded parameters and their gradients in host
memory. ``torch.nn.utils.clip_grad_norm_`` then builds the norm as a DTensor on the CPU and reduces it
over the FSDP group there, which an NCCL-only group refuses ("No backend type associated with device
type cpu", docs/DESIGN.md §2 item 7). Here each gradient shard's sum of squares is taken where the shard lives (no
gradient is copied), the per-mesh partial sums (one scalar each) move to the compute device, the
all-reduce over each mesh dimension the gradients are sharded on runs there, and the clip factor,
computed there, is brought back to every shard's device and applied in place. Dimensions a gradient is
replicated on (HSDP's replicate dimension, the tp dimension of a parameter tensor parallelism leaves whole) are not
summed over: every replica holds the same values.

Only the L2 norm (``actor.grad_clip``) is supported. The clip factor is the one torch uses,
``min(1, max_norm / (norm + 1e-6))``; a non-finite norm is returned as is for the caller to skip the step.
"""

from __future__ import annotations

from typing import Iterable, Union

import torch
import torch.distributed as dist

DeviceLike = Union[str, torch.device]


def _local_and_shard_groups(grad: torch.Tensor):
    """(this rank's tensor, the process groups its shards are spread over, a key for the mesh)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(grad, DTensor):
        return grad, (), None
    mesh = grad.device_mesh
    # Shard, and FSDP2's _StridedShard over a tensor-parallel split (not a Shard subclass): every non-replicated dim
    dims = tuple(i for i, placement in enumerate(grad.placements) if not placement.is_replicate())
    return grad.to_local(), tuple(mesh.get_group(d) for d in dims), (id(mesh), dims)


def clip_grad_norm_on_device(
    parameters: Iterable[torch.nn.Parameter], max_norm: float, compute_device: DeviceLike, pp_group=None
) -> torch.Tensor:
    """Clip the gradients of ``parameters`` (plain or FSDP2 DTensor, on any device) to a global L2 norm of
    ``max_norm``; return the norm before clipping, a 0-dim fp32 tensor on ``compute_device``.

    Every reduction runs on ``compute_device``, so the process group needs a backend for that device only.
    ``pp_group``: pipeline parallel's group, whose ranks hold different parameters (their squares are summed too).
    """
    compute_device = torch.device(compute_device)
    partial: dict = {}  # mesh key -> [groups, sum of squares on the compute device]
    locals_ = []
    for p in parameters:
        if p.grad is None:
            continue
        local, groups, key = _local_and_shard_groups(p.grad)
        locals_.append(local)
        square = torch.linalg.vector_norm(local, 2, dtype=torch.float32).square()
        entry = partial.setdefault(key, [groups, torch.zeros((), dtype=torch.float32, device=compute_device)])
        entry[1] += square.to(compute_device, non_blocking=True)
    total = torch.zeros((), dtype=torch.float32, device=compute_device)
    for groups, square in partial.values():
        for group in groups:
            dist.all_reduce(square, op=dist.ReduceOp.SUM, group=group)
        total += square
    if pp_group is not None:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_group)
    norm = total.sqrt()
    coef = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
    by_device: dict = {}
    for local in locals_:
        if local.device not in by_device:
            by_device[local.device] = coef.to(local.device)
        local.mul_(by_device[local.device].to(local.dtype))
    return norm


def grad_norm_device(param_offload: bool, device: str, compute_device: DeviceLike, tp_size: int = 1, pp_size: int = 1):
    """Where the actor reduces its gradient norm: ``compute_device`` when FSDP2 keeps the parameters (and so
    the gradients) in host memory on a GPU run, whose NCCL group has no CPU backend, or under tensor parallelism
    (``tp_size`` > 1: gradients on a 2-D mesh and on its dp dimension alone, which torch's clip cannot stack);
    or pipeline parallelism (``pp_size`` > 1: squares summed over the stages); otherwise None, i.e.
    ``torch.nn.utils.clip_grad_norm_`` where the gradients are (on CPU runs gloo reduces host tensors)."""
    on_device = (param_offload and device == "cuda") or tp_size > 1 or pp_size > 1
    return torch.device(compute_device) if on_device else None
