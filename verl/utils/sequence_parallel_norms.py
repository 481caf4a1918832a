"""Sequence parallelism of the norms and the residual stream over the tensor-parallel ranks (Megatron-LM's sequence
parallel: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.2.2; verl's
``megatron.sequence_parallel``), on top of the DTensor plan of verl/utils/tensor_parallel.py.

Plain TP keeps the activations between its regions whole on every tp rank: the residual stream, the RMSNorms' inputs
and outputs, and (with gradient checkpointing, as every recipe runs) each decoder layer's stored input. With
``actor_rollout_ref.actor.sequence_parallel`` each tp rank holds 1/tp of the sequence there instead:
- the first decoder layer takes the rank's slice of the (replicated) embedding output;
- the attention and the MLP all-gather their input (the column-parallel projections need every token) and keep the
  rank's slice of their row-parallel output;
- the final norm's output is all-gathered for the LM head (a pipeline's last stage gathers before scoring).
The slices pad the sequence to a multiple of tp; the gathers drop the padding again (the length comes from the
attention's position embeddings). The norms' weights see only the rank's tokens, so their gradients are summed over
tp with Qwen3's q/k norms (``allreduce_replicated_grads``).

Gradients: an all-gathered input's gradient arrives already summed over tp (torch's column-parallel style
all-reduces its input gradient), so its backward keeps the rank's slice; a slice's backward all-gathers. The
row-parallel outputs stay all-reduced (torch's ``RowwiseParallel`` with a replicated output) before the slice, where
Megatron reduce-scatters: this saves the activation memory, not the communication (the bytes each rank moves are
those of plain TP plus one all-gather per region). Nothing is computed differently: the results equal plain TP's
(tests/verl/utils/test_tensor_parallel.py).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from verl.utils.ulysses import gather_seq, pad_to_multiple

SP_KEY = "actor_rollout_ref.actor.sequence_parallel"
_STATE_ATTR = "_sequence_parallel_state"
_NORM_NAMES = ("input_layernorm", "post_attention_layernorm")


def _all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


class _SliceSequence(torch.autograd.Function):
    """Forward: the rank's 1/tp of dim ``dim`` (padded to a multiple of tp). Backward: the slices all-gathered."""

    @staticmethod
    def forward(ctx, x, group, dim):
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.group, ctx.dim, ctx.length = group, dim, x.size(dim)
        full = pad_to_multiple(x, tp, dim)
        size = full.size(dim) // tp
        return full.narrow(dim, rank * size, size).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group, ctx.dim).narrow(ctx.dim, 0, ctx.length), None, None


class SequenceParallelState:
    """The tp group and the sequence length of the pass (set by each attention from its position embeddings)."""

    def __init__(self, group):
        self.group = group
        self.length: Optional[int] = None

    def slice(self, x: torch.Tensor) -> torch.Tensor:
        return _SliceSequence.apply(x, self.group, 1)

    def gather(self, x: torch.Tensor, length: Optional[int] = None) -> torch.Tensor:
        length = self.length if length is None else length
        if length is None:
            raise RuntimeError("sequence-parallel gather before any attention set the sequence length")
        # backward: the rank's slice of a gradient already summed over tp (grad_scale 1), padding dropped by narrow
        return gather_seq(x, self.group, 1, grad_scale=1.0).narrow(1, 0, length)


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def apply_sequence_parallel(model: nn.Module, tp_mesh, gather_final_norm: bool = True) -> list[str]:
    """Hook the tp-split ``model`` (an HF causal LM or a pipeline rank's pruned one) as the module docstring says;
    returns the names of the norm parameters whose gradients must be summed over tp. ``gather_final_norm`` False:
    the caller gathers the final norm's output itself (a pipeline's last stage norms only the scored positions)."""
    state = SequenceParallelState(tp_mesh.get_group())
    base = model.get_decoder()
    prefix = next(n for n, m in model.named_modules() if m is base)
    layers = base.layers.values() if isinstance(base.layers, nn.ModuleDict) else list(base.layers)
    names = []

    def attention_input(module, args, kwargs):
        cos = kwargs["position_embeddings"][0]
        state.length = cos.size(-2)
        kwargs["hidden_states"] = state.gather(kwargs["hidden_states"])
        return args, kwargs

    def region_output(module, args, output):
        if isinstance(output, tuple):
            return (state.slice(output[0]), *output[1:])
        return state.slice(output)

    for layer in layers:
        layer.self_attn.register_forward_pre_hook(attention_input, with_kwargs=True)
        layer.self_attn.register_forward_hook(region_output)
        layer.mlp.register_forward_pre_hook(lambda m, args: (state.gather(args[0]), *args[1:]))
        layer.mlp.register_forward_hook(region_output)
    first = getattr(base.layers, "0", None) if isinstance(base.layers, nn.ModuleDict) else base.layers[0]
    if first is not None:  # the stage holding layer 0 (every rank without pipeline parallel)
        first.register_forward_pre_hook(lambda m, args: (state.slice(args[0]), *args[1:]))
    if base.norm is not None and gather_final_norm:
        base.norm.register_forward_hook(lambda m, args, output: state.gather(_first(output)))
    for name, module in base.named_modules():
        # the final norm sees only the rank's tokens where its output is gathered after it
        final = module is base.norm and base.norm is not None and gather_final_norm
        if name.split(".")[-1] in _NORM_NAMES or final:
            names += [f"{prefix}.{name}.{p}" for p, _ in module.named_parameters(recurse=False)]
    setattr(model, _STATE_ATTR, state)
    return names


def sequence_parallel_of(model: Optional[nn.Module]) -> Optional[SequenceParallelState]:
    """The state ``apply_sequence_parallel`` left on ``model`` (None: not sequence-parallel)."""
    return getattr(model, _STATE_ATTR, None)
