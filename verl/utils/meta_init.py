"""Build an FSDP2-sharded HF model without any rank holding the whole model.

``from_pretrained`` on every rank costs a full fp32 copy per rank (~30 GB host RAM per rank for 7B)
before sharding. Here the model is created with its parameters on the meta device (buffers such as
rotary frequencies are built for real: they are small and not all of them are in checkpoints), the
caller shards it (``fully_shard``), storage is allocated for the local shards only, and each rank reads
from the checkpoint files exactly the rows of each tensor that its shard holds (FSDP2 shards dim 0, so
a shard is one contiguous byte range of a row-major tensor). The ranks of a node together read the
checkpoint once; a rank's peak is its shard plus one tensor's shard in the checkpoint dtype.

Safetensors files are read with plain ``seek``/``readinto`` (their header gives each tensor's byte
range), not mmap, so page cache never counts as the process's memory. ``pytorch_model*.bin`` files are
opened with ``torch.load(mmap=True)`` and only the needed rows are touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import struct
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

logger = logging.getLogger(__name__)

_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorEntry:
    """Where one checkpoint tensor lives: a safetensors byte range, or a (mmap-loaded) .bin tensor."""

    file: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int = 0  # absolute byte offset of the tensor's data (safetensors)
    tensor: Optional[torch.Tensor] = None  # .bin: the mmap-backed tensor

    def read_rows(self, start: int, stop: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rows ``[start, stop)`` of dim 0 (the whole tensor for a scalar), into ``out`` when given
        (same dtype, contiguous, CPU) or a new CPU tensor."""
        if self.tensor is not None:
            rows = self.tensor if not self.shape else self.tensor[start:stop]
            return rows.clone() if out is None else out.copy_(rows)
        shape = self.shape if not self.shape else (stop - start,) + self.shape[1:]
        if out is None:
            out = torch.empty(shape, dtype=self.dtype)
        row_bytes = out.element_size() * math.prod(self.shape[1:])
        nbytes = out.numel() * out.element_size()
        if nbytes:
            with open(self.file, "rb", buffering=0) as f:
                f.seek(self.offset + (start * row_bytes if self.shape else 0))
                view = memoryview(out.view(-1).view(torch.uint8).numpy())
                got = 0
                while got < nbytes:
                    n = f.readinto(view[got:])
                    if not n:
                        raise OSError(f"{self.file}: truncated tensor data ({got} of {nbytes} bytes)")
                    got += n
        return out


def _safetensors_entries(path: str) -> dict[str, TensorEntry]:
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which this loader does not read")
        entries[name] = TensorEntry(
            path, _ST_DTYPES[info["dtype"]], tuple(info["shape"]), 8 + header_len + info["data_offsets"][0]
        )
    return entries


def checkpoint_entries(model_dir: str) -> dict[str, TensorEntry]:
    """Name -> TensorEntry for every tensor of an HF checkpoint folder (safetensors preferred)."""
    for index_name, single, reader in (
        ("model.safetensors.index.json", "model.safetensors", "st"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin", "bin"),
    ):
        index = os.path.join(model_dir, index_name)
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.exists(os.path.join(model_dir, single)):
            files = [single]
        else:
            continue
        entries: dict[str, TensorEntry] = {}
        for name in files:
            path = os.path.join(model_dir, name)
            if reader == "st":
                entries.update(_safetensors_entries(path))
            else:
                state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
                entries.update({k: TensorEntry(path, v.dtype, tuple(v.shape), tensor=v) for k, v in state.items()})
        return entries
    raise FileNotFoundError(f"{model_dir}: no model.safetensors[.index.json] or pytorch_model.bin[.index.json]")


@contextlib.contextmanager
def parameters_on_meta():
    """Parameters registered inside the block are created on the meta device; buffers are not."""
    original = nn.Module.register_parameter

    def register(module, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def _local_rows(param: torch.Tensor):
    """(local tensor, first global row, other-dim offsets) of a parameter, DTensor or plain."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.data, 0, ()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return param.to_local(), (offset[0] if offset else 0), tuple(offset[1:])


@torch.no_grad()
def load_local_shards(module: nn.Module, model_dir: str, entries: Optional[dict[str, TensorEntry]] = None) -> None:
    """Fill every parameter's local shard (and checkpointed persistent buffers) from ``model_dir``."""
    entries = checkpoint_entries(model_dir) if entries is None else entries
    missing = [n for n, _ in module.named_parameters() if n not in entries]
    if missing:
        raise KeyError(
            f"{model_dir}: checkpoint has no tensor for parameters {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )
    named = list(module.named_parameters()) + [(n, b) for n, b in module.named_buffers() if n in entries]
    for name, tensor in named:
        entry = entries[name]
        if tuple(entry.shape) != tuple(tensor.shape):
            raise ValueError(
                f"{model_dir}: tensor {name!r} has shape {entry.shape} in the checkpoint, "
                f"{tuple(tensor.shape)} in the model"
            )
        local, row0, rest = _local_rows(tensor)
        if local.numel() == 0:
            continue
        stop = row0 + (local.shape[0] if local.dim() else 0)
        direct = (
            local.dtype == entry.dtype
            and local.device.type == "cpu"
            and local.is_contiguous()
            and not any(rest)
            and (local.dim() < 2 or local.shape[1:] == tuple(entry.shape[1:]))
        )
        if direct:
            entry.read_rows(row0, stop, out=local)
            continue
        rows = entry.read_rows(row0, stop)
        for dim, start in enumerate(rest, start=1):
            rows = rows.narrow(dim, start, local.shape[dim])
        local.copy_(rows)


def empty_model(
    hf_config,
    dtype: torch.dtype = torch.float32,
    attn_implementation: Optional[str] = None,
    trust_remote_code: bool = False,
) -> nn.Module:
    """The HF causal LM of ``hf_config`` with every parameter on the meta device (no storage)."""
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    with parameters_on_meta():
        return AutoModelForCausalLM.from_config(hf_config, **kwargs)


def _shared_parameters(module: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """(owner module, name) groups of each parameter registered in more than one place (tied embeddings)."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((sub, name))
    return [group for group in owners.values() if len(group) > 1]


def _retie(groups: list[list[tuple[nn.Module, str]]]) -> None:
    """``to_empty`` gives each owner of a meta parameter its own new storage, untying tied embeddings of an
    unsharded module (lm_head then has no checkpoint tensor and would stay uninitialised). Give every
    owner the first owner's parameter again; a group still shared (FSDP2 keeps its tie) is left alone."""
    for (first, first_name), *rest in groups:
        param = first._parameters[first_name]
        for sub, name in rest:
            if sub._parameters[name] is not param:
                sub._parameters[name] = param


def _refuse_converted_layout(model_dir: str, missing: list[str], entries: dict) -> None:
    """One line when the module's parameters are a conversion of the checkpoint's that this loader does not know
    (transformers 5 fuses a MoE layer's experts on load; verl/utils/moe_layout.py stacks those of the model types
    it lists): reading tensors by name cannot build them."""
    for name in missing:
        prefix = name.rsplit(".", 1)[0] + "."
        per_expert = [k for k in entries if k.startswith(prefix)]
        if per_expert:
            raise ValueError(
                f"{model_dir}: parameter {name!r} is built by transformers from {len(per_expert)} checkpoint "
                f"tensors ({per_expert[0]}, ...); meta-device init reads tensors by name and does not "
                f"support this layout (MoE experts of a model type verl/utils/moe_layout.py does not list)"
            )


def materialize(module: nn.Module, model_dir: str, device: str) -> nn.Module:
    """Allocate the (sharded) meta parameters on ``device`` and read each local shard from ``model_dir``.

    Call after ``fully_shard``: only the local shards get storage. Raises KeyError / ValueError naming
    the tensor when the checkpoint lacks a parameter or has another shape.
    """
    from verl.utils.moe_layout import model_layout, stacked_entries

    entries = checkpoint_entries(model_dir)
    # fused MoE experts (Qwen3-MoE's experts.gate_up_proj) read from the checkpoint's per-expert tensors
    entries.update(stacked_entries([n for n, _ in module.named_parameters()], entries, model_layout(module)))
    missing = [n for n, _ in module.named_parameters() if n not in entries]
    if missing:
        _refuse_converted_layout(model_dir, missing, entries)
        raise KeyError(
            f"{model_dir}: checkpoint has no tensor for parameters {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )
    buffers = {n: b.clone() for n, b in module.named_buffers()}
    shared = _shared_parameters(module)
    module.to_empty(device=device)
    _retie(shared)
    with torch.no_grad():
        for name, buf in module.named_buffers():
            buf.copy_(buffers[name])
    load_local_shards(module, model_dir, entries)
    module.eval()  # as from_pretrained leaves it; the actor switches modes itself
    return module


def build_sharded_model(
    model_dir: str,
    hf_config,
    shard: Callable[[nn.Module], nn.Module],
    device: str,
    dtype: torch.dtype = torch.float32,
    attn_implementation: Optional[str] = None,
    trust_remote_code: bool = False,
) -> nn.Module:
    """``empty_model`` -> ``shard(module)`` (``fully_shard`` and friends) -> ``materialize``."""
    module = shard(empty_model(hf_config, dtype, attn_implementation, trust_remote_code))
    return materialize(module, model_dir, device)
