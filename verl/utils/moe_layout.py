"""Qwen3-MoE expert weights: the fused layout the model trains in <-> the per-expert layout checkpoints hold.

transformers 5 builds a Qwen3-MoE layer's experts as two 3-D parameters (``Qwen3MoeExperts``):
``mlp.experts.gate_up_proj [E, 2*I, H]`` (expert k's ``gate_proj.weight [I, H]`` then its ``up_proj.weight``,
concatenated on dim 1; its forward ``chunk(2, -1)`` splits them in that order) and ``mlp.experts.down_proj
[E, H, I]`` (expert k's ``down_proj.weight``). Published checkpoints, ``save_pretrained`` and vLLM's
``load_weights`` use one tensor per expert: ``mlp.experts.K.{gate,up,down}_proj.weight``. transformers converts on
load (its ``conversion_mapping``); the project's own paths need the same conversion:

- meta-device init (verl/utils/meta_init.py) reads each rank's rows of a fused parameter from the per-expert
  tensors (:class:`StackedEntry`: FSDP2 shards dim 0, the expert dim, so a rank reads only its own experts);
- the weight push to the rollout engines (fsdp_sharding_manager.py, split_weights.py) sends per-expert names
  (:func:`checkpoint_buckets`), as vLLM and the HF rollout (hf_rollout.py, :func:`per_expert_views`) take them.

DCP checkpoints keep the fused names (the module's own state dict); the HF export's ``save_pretrained`` writes
per-expert names itself (transformers reverses its load conversion on save).
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Optional

import torch

# model_type -> fused parameter -> the per-expert checkpoint tensors it stacks, in concat order along dim 1
LAYOUTS: dict[str, dict[str, tuple[str, ...]]] = {
    "qwen3_moe": {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)},
}
_FUSED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<param>[A-Za-z_]+)$")


def model_layout(module_or_type) -> Optional[dict[str, tuple[str, ...]]]:
    """The fused-expert layout of a model (a module with ``.config`` or a ``model_type`` string), or None."""
    if isinstance(module_or_type, str):
        return LAYOUTS.get(module_or_type)
    config = getattr(module_or_type, "config", None)
    return LAYOUTS.get(getattr(config, "model_type", None))


def _match(name: str, layout: dict) -> Optional[tuple[str, tuple[str, ...]]]:
    """(``...mlp.experts`` prefix, per-expert parts) of a fused parameter name, else None."""
    m = _FUSED.match(name)
    if m is None or m.group("param") not in layout:
        return None
    return m.group("prefix"), layout[m.group("param")]


def expert_name(prefix: str, expert: int, part: str) -> str:
    return f"{prefix}.{expert}.{part}.weight"


def split_expert_tensor(name: str, tensor: torch.Tensor, layout: dict) -> list[tuple[str, torch.Tensor]]:
    """A fused tensor as its per-expert checkpoint tensors (views, contiguous rows); any other as itself."""
    hit = _match(name, layout)
    if hit is None:
        return [(name, tensor)]
    prefix, parts = hit
    width = tensor.shape[1] // len(parts)
    return [
        (expert_name(prefix, k, part), tensor[k, i * width : (i + 1) * width])
        for k in range(tensor.shape[0])
        for i, part in enumerate(parts)
    ]


def checkpoint_named(named: Iterable[tuple[str, torch.Tensor]], layout) -> Iterator[tuple[str, torch.Tensor]]:
    """A (name, tensor) stream with fused expert tensors split into per-expert ones (unchanged without a layout)."""
    for name, tensor in named:
        if layout is None:
            yield name, tensor
        else:
            yield from split_expert_tensor(name, tensor, layout)


def checkpoint_buckets(module, buckets: Iterable[list]) -> Iterable[list]:
    """Weight-push buckets of ``module`` under checkpoint names (the buckets themselves for a dense model)."""
    layout = model_layout(module)
    if layout is None:
        return buckets
    return (list(checkpoint_named(bucket, layout)) for bucket in buckets)


def split_state_dict(state: dict[str, torch.Tensor], layout: dict) -> dict[str, torch.Tensor]:
    """Fused state dict -> per-expert (checkpoint) names."""
    return dict(checkpoint_named(state.items(), layout))


def fuse_state_dict(state: dict[str, torch.Tensor], fused_names: Iterable[str], layout: dict) -> dict:
    """Per-expert state dict -> the fused parameters ``fused_names`` (other tensors kept as they are)."""
    out = dict(state)
    for name in fused_names:
        hit = _match(name, layout)
        if hit is None:
            continue
        prefix, parts = hit
        count = _expert_count(prefix, parts[0], out)
        out[name] = torch.stack(
            [torch.cat([out.pop(expert_name(prefix, k, p)) for p in parts], dim=0) for k in range(count)]
        )
    return out


def _expert_count(prefix: str, part: str, names) -> int:
    count = 0
    while expert_name(prefix, count, part) in names:
        count += 1
    return count


class StackedEntry:
    """A fused expert parameter read from its per-expert checkpoint tensors, with ``TensorEntry``'s interface
    (``shape``, ``dtype``, ``read_rows``): row ``k`` of dim 0 is expert ``k``, its parts concatenated on dim 1."""

    def __init__(self, experts: list[tuple]):
        self.experts = experts  # experts[k] = the TensorEntry of each part of expert k
        first = experts[0][0]
        self.dtype = first.dtype
        self.shape = (len(experts), sum(e.shape[0] for e in experts[0])) + tuple(first.shape[1:])

    def read_rows(self, start: int, stop: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Experts ``[start, stop)``, into ``out`` when given (same dtype, contiguous, CPU)."""
        if out is None:
            out = torch.empty((stop - start,) + self.shape[1:], dtype=self.dtype)
        for k in range(start, stop):
            row = 0
            for part in self.experts[k]:
                part.read_rows(0, part.shape[0], out=out[k - start, row : row + part.shape[0]])
                row += part.shape[0]
        return out


def stacked_entries(param_names: Iterable[str], entries: dict, layout: Optional[dict]) -> dict[str, StackedEntry]:
    """A :class:`StackedEntry` for each fused parameter of ``param_names`` the checkpoint holds per expert."""
    out: dict[str, StackedEntry] = {}
    if layout is None:
        return out
    for name in param_names:
        hit = _match(name, layout)
        if hit is None or name in entries:
            continue
        prefix, parts = hit
        count = _expert_count(prefix, parts[0], entries)
        experts = [tuple(entries.get(expert_name(prefix, k, p)) for p in parts) for k in range(count)]
        if count and all(e is not None for parts_of in experts for e in parts_of):
            out[name] = StackedEntry(experts)
    return out


def per_expert_views(named: dict[str, torch.Tensor], layout: Optional[dict]) -> dict[str, torch.Tensor]:
    """``named`` (a model's state dict) with each fused expert tensor replaced by per-expert views of its storage:
    writing a view writes the fused parameter (the HF rollout receives pushed weights by checkpoint name)."""
    if layout is None:
        return dict(named)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in named.items():
        out.update(split_expert_tensor(name, tensor.data if _match(name, layout) else tensor, layout))
    return out
