"""Ulysses sequence parallelism: the collectives, with their autograd rules.

Every rank of a sequence-parallel (SP) group holds the same rows but only 1/sp of their positions. Outside
attention nothing mixes positions, so embeddings, MLPs, norms and the LM head run on the local slice.
Attention needs every position: an all-to-all swaps the layout from "all heads, local positions" to
"1/sp of the heads, all positions", plain attention runs per head, and a second all-to-all swaps back
(DeepSpeed-Ulysses; verl's ``ulysses_sequence_parallel_size``). The backward of an all-to-all is the
reverse all-to-all, so gradients are exact.

Per-token results (log-probs, entropy) are all-gathered along the sequence at the end. That gather's
backward keeps the local slice of the gradient and multiplies it by sp: FSDP averages gradients over all
world ranks (dp x sp), while each SP rank only computed its share of the group's one loss, so the scale
makes the average equal a plain data-parallel run.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist


def group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group) -> int:
    return 0 if group is None else dist.get_rank(group)


def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Split ``x`` into sp chunks along ``scatter_dim``, send chunk i to rank i, concatenate what arrives
    along ``gather_dim`` (in rank order)."""
    world = dist.get_world_size(group)
    inputs = [t.contiguous() for t in torch.chunk(x, world, dim=scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(world)]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim).contiguous()


class _SeqAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def gather_seq_scatter_heads(x: torch.Tensor, group, seq_dim: int, head_dim: int) -> torch.Tensor:
    """[.., heads, .., s/sp, ..] -> [.., heads/sp, .., s, ..]; identity without a group."""
    if group_size(group) == 1:
        return x
    return _SeqAllToAll.apply(x, group, head_dim, seq_dim)


def gather_heads_scatter_seq(x: torch.Tensor, group, head_dim: int, seq_dim: int) -> torch.Tensor:
    """The inverse: [.., heads/sp, .., s, ..] -> [.., heads, .., s/sp, ..]; identity without a group."""
    if group_size(group) == 1:
        return x
    return _SeqAllToAll.apply(x, group, seq_dim, head_dim)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim: int, grad_scale: float):
        ctx.group, ctx.dim, ctx.grad_scale = group, dim, grad_scale
        ctx.rank, ctx.local = dist.get_rank(group), x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        local = grad.narrow(ctx.dim, ctx.rank * ctx.local, ctx.local) * ctx.grad_scale
        return local.contiguous(), None, None, None


def gather_seq(x: torch.Tensor, group, dim: int, grad_scale: Optional[float] = None) -> torch.Tensor:
    """All-gather the local slices along ``dim``; backward keeps the local gradient slice times
    ``grad_scale`` (default sp, see the module docstring)."""
    world = group_size(group)
    if world == 1:
        return x
    return _GatherSeq.apply(x, group, dim, float(world if grad_scale is None else grad_scale))


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int, value=0) -> torch.Tensor:
    """Right-pad ``x`` along ``dim`` so its length divides by ``multiple``."""
    length = x.shape[dim]
    pad = math.ceil(length / multiple) * multiple - length
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_full(shape, value)], dim=dim)


def local_slice(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """This rank's contiguous 1/sp of ``x`` along ``dim`` (length must divide)."""
    world = group_size(group)
    if world == 1:
        return x
    if x.shape[dim] % world:
        raise ValueError(f"length {x.shape[dim]} along dim {dim} does not divide by the SP size {world}; pad first")
    chunk = x.shape[dim] // world
    return x.narrow(dim, group_rank(group) * chunk, chunk)


# ------------------------------------------------------------------------------ data plan
def gather_data_in_group(data, group):
    """The rows of every rank of the SP group, in rank order (a DataProto): ranks of a group compute on the
    same rows. The driver dispatches over all world ranks, so the group's rows are the union of its ranks'
    chunks, and each data-parallel group sees world/dp times a rank's chunk (verl: dp = world / sp)."""
    if group_size(group) == 1:
        return data
    from verl.protocol import DataProto

    parts = [None] * group_size(group)
    dist.all_gather_object(parts, data, group=group)
    gathered = DataProto.concat(parts)
    gathered.meta_info = dict(data.meta_info)
    return gathered


def local_rows(data, group):
    """This rank's chunk of a result computed on ``gather_data_in_group``'s rows (the inverse split)."""
    if group_size(group) == 1:
        return data
    return data.chunk(group_size(group))[group_rank(group)]
