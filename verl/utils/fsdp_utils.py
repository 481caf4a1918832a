"""FSDP2 helpers: process groups and meshes, ``fully_shard`` wrapping, offload policy, full-weight streaming.

FSDP2 (``fully_shard`` + DTensor) is the only strategy built on: FSDP1 needs an accelerator and
segfaults on CPU state-dict offload (docs/CPU_STACK.md §3). Full weights leave the shards one tensor at a
time (``DTensor.full_tensor``), grouped into byte-bounded buckets, so a rollout engine can be fed
without materialising a whole state dict on any rank.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, Iterator, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import nn

logger = logging.getLogger(__name__)

# Wrapper prefixes that FSDP1, activation checkpointing and torch.compile put into parameter names.
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")

DTypeLike = Union[str, torch.dtype, None]
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def to_torch_dtype(dtype: DTypeLike) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


# ------------------------------------------------------------------------------ process groups
def init_distributed(device: str) -> tuple[int, int]:
    """Join the default process group from RANK/WORLD_SIZE/MASTER_* env vars (gloo on CPU, nccl on GPU).

    Returns (rank, world_size); a no-op when the group already exists.
    """
    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size()


def create_device_mesh(
    device: str, mesh_shape: Optional[Sequence[int]] = None, mesh_dim_names: Sequence[str] = ("fsdp",)
):
    """A device mesh over the default group: 1-D (``fsdp``) by default, or (``ddp``, ``fsdp``) for HSDP."""
    from torch.distributed.device_mesh import init_device_mesh

    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    world = dist.get_world_size()
    shape = tuple(mesh_shape) if mesh_shape is not None else (world,)
    if len(shape) != len(mesh_dim_names):
        raise ValueError(f"mesh_shape {shape} and mesh_dim_names {tuple(mesh_dim_names)} differ in length")
    if int(torch.tensor(shape).prod()) != world:
        raise ValueError(f"mesh_shape {shape} does not multiply to the world size {world}")
    return init_device_mesh(device, shape, mesh_dim_names=tuple(mesh_dim_names))


# ------------------------------------------------------------------------------ wrapping
def fsdp_version(module: nn.Module) -> int:
    """2 for a ``fully_shard``-ed module, 1 for an FSDP1 wrapper, 0 for a plain module."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(module, FSDPModule):
        return 2
    if isinstance(module, FullyShardedDataParallel):
        return 1
    return 0


def mixed_precision_policy(param_dtype: DTypeLike = None, reduce_dtype: DTypeLike = "float32", device: str = "cuda"):
    """FSDP2 mixed precision: compute in ``param_dtype`` (bf16 on GPU, fp32 on CPU by default)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    param = to_torch_dtype(param_dtype) or (torch.bfloat16 if device == "cuda" else torch.float32)
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=to_torch_dtype(reduce_dtype), cast_forward_inputs=True)


def cpu_offload_policy(enabled: bool, device: str):
    """``CPUOffloadPolicy`` for ``fsdp_config.param_offload`` on GPU; None on CPU (nothing to offload to)."""
    if not enabled:
        return None
    if device == "cpu":
        logger.info("fsdp_config.param_offload ignored on CPU: parameters already live in host memory")
        return None
    from torch.distributed.fsdp import CPUOffloadPolicy

    return CPUOffloadPolicy(pin_memory=True)


def decoder_layer_classes(model: nn.Module, names: Optional[Iterable[str]] = None) -> tuple[type, ...]:
    """Classes to shard one by one: ``names`` if given, else the HF model's ``_no_split_modules``."""
    wanted = set(names) if names is not None else set(getattr(model, "_no_split_modules", None) or [])
    if not wanted:
        raise ValueError("no layer classes to wrap: pass layer_cls_names or use an HF model with _no_split_modules")
    found = {type(m) for m in model.modules() if type(m).__name__ in wanted}
    missing = wanted - {c.__name__ for c in found}
    if names is not None and missing:
        raise ValueError(f"layer classes {sorted(missing)} not found in {type(model).__name__}")
    return tuple(found)


def apply_fsdp2(
    model: nn.Module,
    mesh,
    mp_policy=None,
    reshard_after_forward: bool = True,
    offload_policy=None,
    layer_cls_names: Optional[Iterable[str]] = None,
    min_num_params: int = 0,
) -> nn.Module:
    """``fully_shard`` every decoder layer, then the root (embeddings, final norm, head and tied weights).

    ``min_num_params`` is FSDP1's size-based wrap rule carried over: a decoder layer with fewer parameters
    is not a unit of its own and travels with the root. Fewer units mean fewer collectives per forward
    and backward, which is what a small model on gloo pays for (one unit: 1 all-gather + 1
    reduce-scatter per micro-batch instead of one per layer); large models keep per-layer units (0).
    """
    from torch.distributed.fsdp import OffloadPolicy, fully_shard

    kwargs = dict(
        mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload_policy or OffloadPolicy()
    )
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    classes = decoder_layer_classes(model, layer_cls_names)
    for module in model.modules():
        if isinstance(module, classes) and sum(p.numel() for p in module.parameters()) >= min_num_params:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


# ------------------------------------------------------------------------------ full weights
def clean_param_name(name: str) -> str:
    """The HF name of a parameter seen through FSDP1 / checkpoint / compile wrappers."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _full_tensor(tensor: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)  # cast the shard first: half the bytes on the wire
        if tensor.device.type != tensor.device_mesh.device_type:  # CPU-offloaded shard, GPU mesh
            tensor = tensor.to(tensor.device_mesh.device_type)
        return tensor.full_tensor()
    return tensor if dtype is None else tensor.to(dtype)


def iter_full_params(module: nn.Module, dtype: DTypeLike = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, full tensor) for every parameter and persistent buffer, in state_dict order.

    Works on FSDP2 modules (every rank must iterate: each DTensor is all-gathered) and on plain
    modules (tensors returned as they are, detached). Tied weights are yielded once, under the first
    name (``model.embed_tokens.weight``, not ``lm_head.weight``).
    """
    dtype = to_torch_dtype(dtype)
    seen: set[int] = set()
    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=True).items():
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            yield clean_param_name(name), _full_tensor(tensor.detach(), dtype)


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a tensor stream into lists of at most ``bucket_bytes`` (a larger tensor travels alone)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_nbytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def get_fsdp_full_state_dict(module: nn.Module, cpu_offload: bool = True, rank0_only: bool = True) -> dict:
    """The whole unsharded state dict (rank 0 only by default, others get {}); for checkpoints."""
    if fsdp_version(module) == 0:
        return {clean_param_name(k): v.detach() for k, v in module.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload and rank0_only)
    state = get_model_state_dict(module, options=options)
    if not rank0_only:
        return {k: v for k, v in state.items()}
    return state if dist.get_rank() == 0 else {}


def load_full_state_dict_into_fsdp2(module: nn.Module, full_state_dict: dict, strict: bool = True) -> None:
    """Load an unsharded state dict held by rank 0 (others pass {}) into an FSDP2 module's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
    # set_model_state_dict swaps the dict's entries for DTensors; keep the caller's dict intact.
    set_model_state_dict(module, dict(full_state_dict), options=options)
