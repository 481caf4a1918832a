"""The actor's forward under Ulysses sequence parallelism: per-token log-probs and entropy of a micro-batch.

Each rank of the SP group holds the same micro-batch. The attention masks are built once for the full
(padded) length, exactly as transformers would build them for a plain forward, and handed to the model as
its prepared mask mapping; the model then runs on this rank's 1/sp slice of the positions. Inside every
attention layer the wrapped attention function (installed into transformers' ``AttentionInterface`` for
sdpa and flash-attention; inert unless a Ulysses forward is active) all-to-alls q/k/v to "heads/sp, all
positions", runs the original kernel with the full mask, and all-to-alls back. Log-probs of the next
token are computed on the local slice (labels = input ids shifted by one, sliced the same way), so no
[*, V] tensor ever crosses ranks: only [rows, positions] log-probs are all-gathered.

GQA: kv heads split over the SP ranks when sp divides them; when there are fewer kv heads than SP ranks
they are repeated ``sp / kv_heads`` times first (as verl does), so each rank gets the kv head its query
heads use. Padded rows (``use_remove_padding=False``, sdpa on CPU) and packed rows (flash-attention's
varlen path on GPU; position ids restart per sequence) are both supported. Eager attention is not.

The SP group and the full-length position ids travel as keyword arguments of the model call
(``ulysses_group``, ``ulysses_position_ids``): transformers hands a model's extra kwargs down to every
attention function. There is no global "SP is on" flag: under (non-reentrant) gradient checkpointing a
decoder layer keeps its call's kwargs and re-runs with them in backward, so the recomputation does the
same all-to-alls as the forward (a flag set only during the forward let it fall through, docs/DESIGN.md §2 item 5).

LM head (docs/DESIGN.md §2 item 6): with ``chunk_size`` > 0 the head scores only this rank's positions that predict a
response token, ``chunk_size`` tokens at a time (``response_head.scoring_head``), so no
``[rows, s/sp, V]`` fp32 logits exist. ``chunk_size`` 0 keeps the dense head (models whose logits are
not a plain linear head: the actor passes 0 for them).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from verl.utils.parallel_check import check_heads
from verl.workers.actor.response_head import scoring_head
from verl.utils.torch_functional import logprobs_and_entropy_from_logits, logprobs_from_logits
from verl.utils.ulysses import (
    gather_heads_scatter_seq,
    gather_seq,
    gather_seq_scatter_heads,
    group_size,
    local_slice,
    pad_to_multiple,
)

WRAPPED_IMPLEMENTATIONS = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4")


# Keyword arguments of the model call that carry the SP state down to the attention functions.
GROUP_KWARG, POSITIONS_KWARG = "ulysses_group", "ulysses_position_ids"


def _wrap(attention_fn):
    @functools.wraps(attention_fn)
    def ulysses_attention(module, query, key, value, attention_mask, *args, **kwargs):
        group = kwargs.pop(GROUP_KWARG, None)
        full_positions = kwargs.pop(POSITIONS_KWARG, None)
        if group is None:
            return attention_fn(module, query, key, value, attention_mask, *args, **kwargs)
        sp = group_size(group)
        if key.shape[1] < sp:  # fewer kv heads than ranks: repeat each so every rank gets its query heads' one
            repeat = sp // key.shape[1]
            key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
        # [b, heads, s/sp, d] -> [b, heads/sp, s, d]
        query, key, value = (gather_seq_scatter_heads(t, group, seq_dim=2, head_dim=1) for t in (query, key, value))
        if "position_ids" in kwargs and full_positions is not None:
            kwargs["position_ids"] = full_positions  # flash varlen finds packed sequences by these
        saved_groups = getattr(module, "num_key_value_groups", None)
        if saved_groups is not None:
            module.num_key_value_groups = query.shape[1] // key.shape[1]
        try:
            out, weights = attention_fn(module, query, key, value, attention_mask, *args, **kwargs)
        finally:
            if saved_groups is not None:
                module.num_key_value_groups = saved_groups
        # transformers' kernels return [b, s, heads/sp, d] -> [b, s/sp, heads, d]
        return gather_heads_scatter_seq(out, group, head_dim=2, seq_dim=1), weights

    ulysses_attention._ulysses_wrapped = True
    return ulysses_attention


def install_ulysses_attention() -> None:
    """Wrap transformers' sdpa/flash attention functions once per process (the wrapper is a pass-through
    outside ``ulysses_forward``, so plain forwards and the HF rollout are unaffected)."""
    from transformers.modeling_utils import AttentionInterface

    for name in WRAPPED_IMPLEMENTATIONS:
        fn = AttentionInterface._global_mapping.get(name)
        if fn is not None and not getattr(fn, "_ulysses_wrapped", False):
            AttentionInterface.register(name, _wrap(fn))


def _model_config(module):
    config = getattr(module, "config", None)
    if config is None:
        raise ValueError("Ulysses sequence parallelism needs an HF model with a .config")
    return config


def check_model(module, sp_size: int) -> None:
    """Reject models Ulysses cannot split: eager attention, or heads that do not divide (one-line errors)."""
    config = _model_config(module)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in WRAPPED_IMPLEMENTATIONS:
        raise ValueError(
            f"Ulysses sequence parallelism needs sdpa or flash attention "
            f"(actor_rollout_ref.model.attn_implementation), got {impl!r}"
        )
    heads = config.num_attention_heads
    check_heads(heads, getattr(config, "num_key_value_heads", None) or heads, sp_size)


def _mask_mapping(config, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], position_ids):
    """The masks transformers would build for a plain forward over these full-length inputs."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    dummy = torch.empty(input_ids.shape + (1,), dtype=torch.float32, device=input_ids.device)  # shape/device only
    kwargs = dict(
        config=config,
        inputs_embeds=dummy,
        attention_mask=attention_mask,
        past_key_values=None,
        position_ids=position_ids,
    )
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    mapping = {"full_attention": create_causal_mask(**kwargs)}
    if "sliding_attention" in types:
        mapping["sliding_attention"] = create_sliding_window_causal_mask(**kwargs)
    return mapping


def _local_token_stats(
    module,
    group,
    input_ids,
    attention_mask,
    position_ids,
    temperature: float,
    calculate_entropy: bool,
    scored: torch.Tensor,
    chunk_size: int,
):
    """Full-length inputs [b, s] (s divisible by sp) -> (entropy or None, log-probs), each [b, s], where
    position t scores ``input_ids[t + 1]`` (the last position scores a wrapped-around token: ignore it).

    ``scored`` [b, s] bool marks the positions whose values are used; with ``chunk_size`` > 0 only those
    are scored (zeros elsewhere), through the chunked head.
    """
    install_ulysses_attention()
    mapping = _mask_mapping(_model_config(module), input_ids, attention_mask, position_ids)
    labels = torch.roll(input_ids, shifts=-1, dims=1)
    ids_local, pos_local, labels_local = (local_slice(t, group, dim=1) for t in (input_ids, position_ids, labels))
    call = dict(
        input_ids=ids_local,
        attention_mask=mapping,
        position_ids=pos_local,
        use_cache=False,
        **{GROUP_KWARG: group, POSITIONS_KWARG: position_ids},
    )
    if chunk_size > 0:
        rows, cols = local_slice(scored, group, dim=1).nonzero(as_tuple=True)
        with scoring_head(
            module,
            rows,
            cols,
            labels_local[rows, cols],
            temperature=temperature,
            chunk_size=chunk_size,
            with_entropy=calculate_entropy,
        ):
            out = module(**call).logits  # [T, 2] (log p, entropy) or [T, 1]
        local = out.new_zeros(ids_local.shape + (out.shape[-1],)).index_put((rows, cols), out)
        log_probs = gather_seq(local[..., 0], group, dim=1)
        return (gather_seq(local[..., 1], group, dim=1) if calculate_entropy else None), log_probs
    logits = module(**call).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if calculate_entropy:
        log_probs, entropy = logprobs_and_entropy_from_logits(logits, labels_local)
        return gather_seq(entropy, group, dim=1), gather_seq(log_probs, group, dim=1)
    return None, gather_seq(logprobs_from_logits(logits, labels_local), group, dim=1)


def ulysses_response_log_probs(
    module, micro: dict, temperature: float, calculate_entropy: bool, group, packed: bool = False, chunk_size: int = 0
):
    """(entropy [b, L] or None, log-probs [b, L]) of the response tokens, equal to the plain forward's.

    ``packed``: valid tokens of all rows go into one row (flash-attention varlen on GPU); otherwise the
    padded rows are split along positions as they are. ``chunk_size`` > 0: the chunked LM head, scoring
    only the positions that predict a response token (values at masked response positions are 0).
    """
    input_ids, attention_mask = micro["input_ids"], micro["attention_mask"]
    position_ids, responses = micro["position_ids"], micro["responses"]
    b, s = input_ids.shape
    sp = group_size(group)
    response_length = responses.size(-1)
    # position t scores token t + 1: the response's scores sit one step to the left.
    window = slice(s - response_length - 1, s - 1)
    scored = torch.zeros_like(attention_mask, dtype=torch.bool)
    if response_length:
        scored[:, window] = attention_mask[:, -response_length:].bool()
    if packed:
        valid = attention_mask.bool()
        flat_ids = pad_to_multiple(input_ids[valid].unsqueeze(0), sp, dim=1)
        total = int(valid.sum())
        # The padding forms a sequence of its own (positions 0..pad-1), so it never joins a real one.
        flat_pos = torch.cat(
            [
                position_ids[valid],
                torch.arange(flat_ids.shape[1] - total, device=input_ids.device, dtype=position_ids.dtype),
            ]
        ).unsqueeze(0)
        flat_scored = pad_to_multiple(scored[valid].unsqueeze(0), sp, dim=1, value=False)
        ent, lp = _local_token_stats(
            module, group, flat_ids, None, flat_pos, temperature, calculate_entropy, flat_scored, chunk_size
        )
        lp_full = lp.new_zeros(b, s)
        lp_full[valid] = lp[0, :total]
        ent_full = None
        if ent is not None:
            ent_full = ent.new_zeros(b, s)
            ent_full[valid] = ent[0, :total]
    else:
        ids = pad_to_multiple(input_ids, sp, dim=1)
        mask = pad_to_multiple(attention_mask, sp, dim=1)
        pos = pad_to_multiple(position_ids, sp, dim=1)
        ent_full, lp_full = _local_token_stats(
            module,
            group,
            ids,
            mask,
            pos,
            temperature,
            calculate_entropy,
            pad_to_multiple(scored, sp, dim=1, value=False),
            chunk_size,
        )
        lp_full = lp_full[:, :s]
        ent_full = ent_full[:, :s] if ent_full is not None else None
    return (ent_full[:, window] if ent_full is not None else None), lp_full[:, window]
