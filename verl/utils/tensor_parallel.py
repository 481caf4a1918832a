"""Tensor parallelism (DTensor) of the actor and reference: the plan per architecture, its application, the checks.

``actor_rollout_ref.actor.tensor_model_parallel_size`` = tp splits every decoder layer over groups of tp consecutive
ranks (Megatron-LM's layout: q/k/v/gate/up column-wise, o/down row-wise; attention heads split, so tp must divide
the query and kv heads). The plan is transformers' own ``config.base_model_tp_plan`` translated to torch's
``parallelize_module`` styles (``translate_plan``; a style without a translation raises, so none is skipped
silently), the approach of NeMo-RL's ``nemo_rl/models/dtensor/parallelize.py`` (commit 50b4eef) and torchtitan's
HF backend (``torchtitan/experiments/transformers_modeling_backend/parallelize.py``, commit b5bcd76).

Around the decoder:
- The LM head is split by vocabulary rows (``Shard(0)``); the actor scores tokens through
  ``verl.utils.vocab_parallel`` (no vocabulary gather). Its plain forward (the dense path, ``logprob_chunk_size`` 0)
  gathers the weight and returns full logits. Tied embeddings: ``embed_tokens`` is split the same way
  (vocab-parallel lookup, torch's ``RowwiseParallel`` on an ``nn.Embedding``) and the head shares its weight. An
  untied ``embed_tokens`` is split by rows too, with Megatron-LM's vocab-parallel lookup (``_vocab_parallel_lookup``:
  each rank looks up the ids in its rows, zeros elsewhere, all-reduce), not torch's style: under ``RowwiseParallel``
  torch 2.13's embedding backward returns a replicated ``[V, H]`` gradient on every tp rank, whose placement then
  differs from the parameter's under FSDP2.
- Parameters the plan marks ``replicated_with_grad_allreduce`` (Qwen3's per-head ``q_norm``/``k_norm``) see only the
  rank's heads: their gradients are summed over the tp group before the optimizer step
  (``allreduce_replicated_grads``).
- FSDP2 then shards every parameter over the ``dp`` dimension of the same 2-D ``(dp, tp)`` mesh
  (``build_tp_mesh``), so the result composes with the existing meta-device init and checkpoints.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist
from torch import nn

TP_KEY = "actor_rollout_ref.actor.tensor_model_parallel_size"
PP_KEY = "actor_rollout_ref.actor.pipeline_model_parallel_size"
# model_type -> the family the plan was checked on (CPU/gloo parity, tests/verl/utils/test_tensor_parallel.py)
SUPPORTED = {"qwen2": "Qwen2/Qwen2.5", "qwen3": "Qwen3", "llama": "Llama-3.x"}
GRAD_ALLREDUCE = "replicated_with_grad_allreduce"
_GRAD_ALLREDUCE_ATTR = "_tp_grad_allreduce_params"


def translate_plan(hf_plan: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """``(parallelize_module plan, module patterns whose parameters need a tp grad all-reduce)`` of a transformers
    ``base_model_tp_plan`` (keys relative to the base model, ``*`` wildcards kept: ``parallelize_module`` takes them).
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles, allreduce = {}, []
    for path, style in hf_plan.items():
        if style == "colwise":
            styles[path] = ColwiseParallel()
        elif style == "rowwise":
            styles[path] = RowwiseParallel()
        elif style == "embedding_rowwise":  # transformers adds it for tied embeddings: vocab-parallel lookup
            styles[path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        elif style == GRAD_ALLREDUCE:
            allreduce.append(path)
        else:
            raise ValueError(f"tensor-parallel style {style!r} of {path!r} has no translation to torch's styles")
    return styles, allreduce


def plan_error(model_type: Optional[str], tp: int) -> Optional[str]:
    """One line when tp > 1 and the architecture has no checked plan."""
    if tp > 1 and model_type not in SUPPORTED:
        return (
            f"'{TP_KEY}'={tp}: architecture {model_type!r} has no tensor-parallel plan "
            f"(supported: {', '.join(f'{k} ({v})' for k, v in SUPPORTED.items())})"
        )
    return None


def tp_layout_errors(model_config: Optional[Mapping[str, Any]], tp: int) -> list[str]:
    """Pre-flight lines of a local model's config.json (None: not on disk yet, nothing to check) at tp ranks."""
    from verl.utils.parallel_check import actor_tp_heads_error

    if tp <= 1 or model_config is None:
        return []
    errors = [e for e in (plan_error(model_config.get("model_type"), tp),) if e]
    heads = model_config.get("num_attention_heads")
    if isinstance(heads, int):
        problem = actor_tp_heads_error(heads, int(model_config.get("num_key_value_heads") or heads), tp)
        if problem:
            errors.append(problem)
    return errors


def check_model(model: nn.Module, tp: int) -> None:
    """``tp_layout_errors`` of a built model, as a ValueError (the worker's own check)."""
    cfg = model.config
    errors = tp_layout_errors(
        {
            "model_type": getattr(cfg, "model_type", None),
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
        },
        tp,
    )
    if errors:
        raise ValueError("; ".join(errors))


def build_tp_mesh(device: str, world_size: int, tp: int):
    """The ``(dp, tp)`` mesh: tp groups of consecutive ranks (the rows a tp group shares come from the driver's
    chunks of its ranks, as Ulysses SP's groups, verl/utils/ulysses.py)."""
    from torch.distributed.device_mesh import init_device_mesh

    if tp < 1 or world_size % tp:
        raise ValueError(f"'{TP_KEY}'={tp} must divide the world size {world_size}")
    return init_device_mesh(device, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))


def _gathered_head_forward(head: nn.Linear):
    """The head's forward on a vocab-split weight: full logits (the weight all-gathered over tp)."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        weight = head.weight.full_tensor()
        bias = head.bias.full_tensor() if head.bias is not None else None
        return torch.nn.functional.linear(hidden, weight, bias)

    return forward


class _SumOverTP(torch.autograd.Function):
    """Forward: all-reduce (sum) the ranks' partial lookups. Backward: identity (the output's gradient is the same on
    every tp rank, and each rank's rows take only their own ids' share of it)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _vocab_parallel_lookup(embed: nn.Embedding):
    """``embed``'s forward on a weight split by vocabulary rows over tp (a DTensor ``Shard(0)`` on the tp mesh)."""

    def forward(ids: torch.Tensor) -> torch.Tensor:
        local, start, group = vocab_shard(embed.weight)
        rel = ids - start
        outside = (rel < 0) | (rel >= local.size(0))
        pad = embed.padding_idx
        local_pad = pad - start if pad is not None and 0 <= pad - start < local.size(0) else None
        out = torch.nn.functional.embedding(rel.masked_fill(outside, 0), local, padding_idx=local_pad)
        return _SumOverTP.apply(out.masked_fill(outside.unsqueeze(-1), 0), group)

    return forward


def apply_tensor_parallel(
    model: nn.Module, tp_mesh, sequence_parallel: bool = False, gather_final_norm: bool = True
) -> nn.Module:
    """Split ``model`` (an HF causal LM, on meta or materialised) over the 1-D ``tp_mesh``; call before
    ``fully_shard``. Raises ValueError for an architecture without a plan or heads that do not split.
    ``sequence_parallel``: the norms and the residual stream split by sequence too (verl/utils/sequence_parallel_norms.py;
    ``gather_final_norm`` as there)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    tp = tp_mesh.size()
    check_model(model, tp)
    base = model.get_decoder()
    styles, allreduce = translate_plan(model.config.base_model_tp_plan or {})
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    parallelize_module(base, tp_mesh, styles)
    if head is not None:  # a pipeline stage (verl/utils/pipeline_parallel.py) may hold no head
        if tied:  # vocab-parallel lookup (masked local rows, partial sums all-reduced); the head shares its rows
            if not isinstance(embed.weight, DTensor):  # the plan did not split it already (embedding_rowwise)
                style = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
                parallelize_module(embed, tp_mesh, style)
            head.weight = embed.weight
        else:
            head.weight = nn.Parameter(distribute_tensor(head.weight, tp_mesh, [Shard(0)]), head.weight.requires_grad)
        if head.bias is not None:
            head.bias = nn.Parameter(distribute_tensor(head.bias, tp_mesh, [Shard(0)]), head.bias.requires_grad)
        head.forward = _gathered_head_forward(head)
    if embed is not None and not isinstance(embed.weight, DTensor):  # untied (or a first stage without the head)
        embed.weight = nn.Parameter(distribute_tensor(embed.weight, tp_mesh, [Shard(0)]), embed.weight.requires_grad)
        embed.forward = _vocab_parallel_lookup(embed)
    prefix = next(n for n, m in model.named_modules() if m is base)
    names = [
        f"{prefix}.{mod_name}.{p_name}"
        for mod_name, mod in base.named_modules()
        if any(fnmatch.fnmatchcase(mod_name, pattern) for pattern in allreduce)
        for p_name, _ in mod.named_parameters(recurse=False)
    ]
    if sequence_parallel and tp > 1:
        from verl.utils.sequence_parallel_norms import apply_sequence_parallel

        names += apply_sequence_parallel(model, tp_mesh, gather_final_norm)
    # names, not handles: fully_shard replaces the Parameter objects
    setattr(model, _GRAD_ALLREDUCE_ATTR, (tuple(names), tp_mesh))
    return model


def tp_size_of(model: nn.Module) -> int:
    """The tp degree ``apply_tensor_parallel`` gave ``model`` (1 when it was not split)."""
    state = getattr(model, _GRAD_ALLREDUCE_ATTR, None)
    return 1 if state is None else state[1].size()


@torch.no_grad()
def allreduce_replicated_grads(model: nn.Module) -> None:
    """Sum over the tp group the gradients of the parameters each tp rank only sees a part of (Qwen3's
    ``q_norm``/``k_norm``: one rank's heads); a no-op for a model without them. Call after backward, before
    clipping; FSDP's dp reduction has already run (the sums commute)."""
    state = getattr(model, _GRAD_ALLREDUCE_ATTR, None)
    if state is None or not state[0]:
        return
    names, tp_mesh = state
    group = tp_mesh.get_group()
    for name in names:
        grad = model.get_parameter(name).grad
        if grad is not None:
            dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)


def vocab_shard(weight: torch.Tensor):
    """``(local rows, first global row, tp group)`` of a head weight split by vocabulary rows over the ``tp`` mesh
    (``build_tp_mesh``'s dimension); None for any other weight."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(weight, DTensor) or weight.device_mesh.mesh_dim_names != ("tp",):
        return None  # a plain weight (FSDP2 hands the forward its unsharded parameters)
    if weight.placements != (Shard(0),):
        raise ValueError(
            f"a vocabulary-split weight is placed {weight.placements} on the tp mesh; the vocab-parallel head and lookup "
            "need Shard(0)"
        )
    _, offset = compute_local_shape_and_global_offset(weight.shape, weight.device_mesh, weight.placements)
    return weight.to_local(), int(offset[0]), weight.device_mesh.get_group()
