"""Shared-prompt forward: the n responses of a GRPO group run over one forward of their common prompt.

In a micro-batch of ``[prompt | response]`` rows, the n samples of a group (and LUFFY's off-policy
slots) repeat the same left-padded prompt. A causal LM's prompt positions never see the response, so
their hidden states and keys/values are identical across the group: computing them once per distinct
prompt and letting every response attend to that one cache gives the same logits as the padded
forward, with the prompt's share of the compute divided by n (half of all tokens in a short-answer
task). Gradients flow back through the index that expands the cache, so the prompt's parameters see
the sum over the group, exactly as in the padded forward.

Two calls of the (FSDP-wrapped) model per micro-batch: the prompts with ``use_cache=True``, then the
responses with the expanded cache as ``past_key_values``. Works with any HF causal LM whose cache is a
``DynamicCache`` of full-attention layers; returns None (use the plain forward) when no prompt repeats,
and when activation checkpointing is active (a training-mode model with gradient checkpointing on):
transformers then drops every layer's cache (recomputing a layer would append its keys twice), so the
responses would have no prompt to attend to. Log-prob passes (eval mode) keep the shared forward.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch


def group_rows_by_prompt(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int):
    """(first row of each distinct prompt [u], index of each row's prompt among them [b])."""
    key = torch.cat([input_ids[:, :prompt_width], attention_mask[:, :prompt_width].to(input_ids.dtype)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    u = int(inverse.max()) + 1 if inverse.numel() else 0
    first = torch.full((u,), input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    first.scatter_reduce_(0, inverse, torch.arange(input_ids.shape[0], device=input_ids.device), reduce="amin")
    return first, inverse


def checkpointing_drops_cache(module: torch.nn.Module) -> bool:
    """Whether this forward would run under HF activation checkpointing (which disables the KV cache)."""
    return bool(module.training and getattr(module, "is_gradient_checkpointing", False))


def shared_prompt_logits(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
) -> Optional[torch.Tensor]:
    """Logits ``[b, response_length, V]`` predicting each response token, or None when no prompt repeats.

    Row i's logits at response position t equal those of the padded forward at column
    ``prompt_width + t - 1`` (the position whose next token is response token t).
    """
    if checkpointing_drops_cache(module):
        return None
    prompt_width = input_ids.shape[1] - response_length
    if prompt_width < 1 or response_length < 1:
        return None
    first, inverse = group_rows_by_prompt(input_ids, attention_mask, prompt_width)
    if first.numel() == input_ids.shape[0]:
        return None
    prompt_logits, response_logits = prompt_then_responses(
        module, input_ids, attention_mask, position_ids, prompt_width, first, inverse
    )
    last_prompt_logits = prompt_logits[:, -1].index_select(0, inverse)
    return torch.cat([last_prompt_logits[:, None], response_logits[:, :-1]], dim=1)


def prompt_then_responses(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_width: int,
    first: torch.Tensor,
    inverse: torch.Tensor,
    prompt_head=contextlib.nullcontext(),
    response_head=contextlib.nullcontext(),
):
    """The two calls: distinct prompts (only the last position goes through the head), then every row's
    response over its prompt's expanded cache. Returns the two outputs' ``logits``; ``prompt_head`` and
    ``response_head`` are contexts active around each call (``response_head.py`` scores tokens there)."""
    from transformers import DynamicCache

    prompt_cache = DynamicCache(config=module.config)
    with prompt_head:
        out = module(
            input_ids=input_ids[first, :prompt_width],
            attention_mask=attention_mask[first, :prompt_width],
            position_ids=position_ids[first, :prompt_width],
            past_key_values=prompt_cache,
            use_cache=True,
            logits_to_keep=1,
        )
    prompt_logits = out.logits
    shared = out.past_key_values
    expanded = DynamicCache(config=module.config)
    for layer_idx, layer in enumerate(shared.layers):
        expanded.update(layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse), layer_idx)
    with response_head:
        out = module(
            input_ids=input_ids[:, prompt_width:],
            attention_mask=attention_mask,
            position_ids=position_ids[:, prompt_width:],
            past_key_values=expanded,
            use_cache=True,
        )
    return prompt_logits, out.logits
