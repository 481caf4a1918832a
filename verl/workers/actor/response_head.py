"""Response-token log-probs and entropy from an HF causal LM without its ``[rows, width, V]`` logits.

The actor only needs the LM head at the positions that predict a response token (attention mask 1).
While a forward runs, ``scoring_head`` swaps the output embedding's ``forward`` for one that gathers
those positions from the final hidden states (packed ``[T, H]``) and scores them in token chunks
(``verl.utils.chunked_logprobs``; a tensor-parallel head split by vocabulary rows: ``verl.utils.vocab_parallel``):
the model's "logits" output becomes ``[T, 2]`` (log p, entropy).
Swapping the head inside the model's own call keeps FSDP2's hooks in charge of the head's weight (it
is gathered, used and its gradient reduce-scattered exactly as for the dense head).

``response_logprobs`` covers the three forwards of ``dp_actor``: padded rows, packed rows (remove
padding) and the shared-prompt forward, and returns ``[b, response_length]`` tensors with zeros at
masked positions (the dense path leaves unused values there; every consumer masks them).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from verl.utils.chunked_logprobs import chunked_logprobs_entropy
from verl.utils.tensor_parallel import vocab_shard
from verl.utils.vocab_parallel import vocab_parallel_logprobs_entropy
from verl.workers.actor.shared_prompt import checkpointing_drops_cache, group_rows_by_prompt, prompt_then_responses

# Config fields of HF models that transform the head's output after the matmul (Gemma 2 soft-capping,
# Cohere's logit scale): those models keep the dense path.
_POST_HEAD_FIELDS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def supports_scoring_head(module: torch.nn.Module) -> bool:
    """True when the model's logits are exactly ``lm_head(hidden)`` with a linear head."""
    get_head = getattr(module, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    weight = getattr(head, "weight", None)
    if head is None or weight is None or weight.dim() != 2:
        return False
    config = getattr(module, "config", None)
    return not any(getattr(config, f, None) not in (None, 1, 1.0) for f in _POST_HEAD_FIELDS)


@contextlib.contextmanager
def scoring_head(
    module: torch.nn.Module,
    rows: torch.Tensor,
    cols: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
):
    """While active, the model's head returns ``[T, 2]`` = (log p(labels), entropy) of ``hidden[rows, cols]``
    (``[T, 1]``, log p only, without entropy) instead of ``[b, s, V]`` logits."""
    head = module.get_output_embeddings()

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        kw = dict(temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy)
        split = vocab_shard(head.weight)  # tensor parallel: this rank's vocabulary rows (verl/utils/tensor_parallel.py)
        if split is None:
            logp, entropy = chunked_logprobs_entropy(hidden[rows, cols], head.weight, labels, bias=head.bias, **kw)
        else:
            weight, vocab_start, group = split
            bias = head.bias.to_local() if head.bias is not None else None
            logp, entropy = vocab_parallel_logprobs_entropy(
                hidden[rows, cols], weight, labels, vocab_start=vocab_start, group=group, bias=bias, **kw
            )
        return torch.stack([logp, entropy], dim=-1) if with_entropy else logp.unsqueeze(-1)

    previous = head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del head.forward
        else:
            head.forward = previous


def _scatter(b: int, width: int, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[b, width]`` fp32 zeros with ``values`` at (rows, cols); differentiable in ``values``."""
    return values.new_zeros(b, width).index_put((rows, cols), values)


def response_logprobs(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    responses: torch.Tensor,
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    packed: bool = False,
    shared_prompt: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log_probs, entropy or None)``, each ``[b, R]`` fp32, of ``responses`` under ``module``.

    ``packed``: one row of the valid tokens (position ids restart per sequence), as ``_packed_logits``.
    ``shared_prompt``: prompts once per group, responses over the expanded cache (padded rows only);
    without a repeated prompt it runs the padded forward.
    """
    b, width = input_ids.shape
    R = responses.size(-1)
    rows, t = attention_mask[:, -R:].bool().nonzero(as_tuple=True)
    labels = responses[rows, t]
    kw = dict(temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy)
    if shared_prompt and not packed:
        scored = _shared_prompt_scores(module, input_ids, attention_mask, position_ids, R, rows, t, labels, kw)
        if scored is not None:
            return _unpack(scored, b, R, with_entropy)
    cols = t + (width - R - 1)  # the position whose next token is response token t
    if packed:
        valid = attention_mask.bool()
        if not bool(valid[rows, cols].all()):
            raise ValueError("a response token follows a padding position (empty prompt?): nothing predicts it")
        flat = (valid.flatten().cumsum(0) - 1).view_as(valid)
        with scoring_head(module, torch.zeros_like(rows), flat[rows, cols], labels, **kw):
            out = module(
                input_ids=input_ids[valid].unsqueeze(0),
                position_ids=position_ids[valid].unsqueeze(0),
                attention_mask=None,
                use_cache=False,
            )
    else:
        with scoring_head(module, rows, cols, labels, **kw):
            out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return _unpack((rows, t, out.logits), b, R, with_entropy)


def _shared_prompt_scores(module, input_ids, attention_mask, position_ids, R, rows, t, labels, kw):
    """(rows, t, [T, k] scores) through the shared-prompt forward, or None when no prompt repeats."""
    prompt_width = input_ids.shape[1] - R
    if (
        prompt_width < 1 or R < 1 or checkpointing_drops_cache(module)
    ):  # no prompt cache under checkpointing (docs/DESIGN.md §2 item 13)
        return None
    first, inverse = group_rows_by_prompt(input_ids, attention_mask, prompt_width)
    if first.numel() == input_ids.shape[0]:
        return None
    # Response token 0 is predicted by the prompt call's last position ([u, 1, H]), token t>0 by the
    # response call's position t-1.
    at0 = t == 0
    rows0, rows1, t1 = rows[at0], rows[~at0], t[~at0]
    prompt_head = scoring_head(module, inverse[rows0], torch.zeros_like(rows0), labels[at0], **kw)
    response_head = scoring_head(module, rows1, t1 - 1, labels[~at0], **kw)
    s0, s1 = prompt_then_responses(
        module,
        input_ids,
        attention_mask,
        position_ids,
        prompt_width,
        first,
        inverse,
        prompt_head=prompt_head,
        response_head=response_head,
    )
    return torch.cat([rows0, rows1]), torch.cat([t[at0], t1]), torch.cat([s0, s1])


def _unpack(scored, b: int, R: int, with_entropy: bool):
    rows, t, scores = scored
    log_probs = _scatter(b, R, rows, t, scores[:, 0])
    entropy = _scatter(b, R, rows, t, scores[:, 1]) if with_entropy else None
    return log_probs, entropy
