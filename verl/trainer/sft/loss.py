"""SFT loss: summed next-token NLL of the masked (response) tokens, and its unbiased global token mean.

The trainer reduces with one denominator for the whole optimizer step: the response tokens of the global
batch, counted over all micro-batches and all ranks before the first backward. Each micro-batch then
contributes ``Σ nll / N_global`` (times the world size, because FSDP averages gradients over ranks), so
the update is the gradient of ``Σ_all tokens nll / N_global`` however the batch is split. OpenRLHF-era
SFT took a token mean per micro-batch and averaged those, which over-weights tokens of short
micro-batches (docs/METHOD.md §2.3, third-party note).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _nll_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="sum")


def masked_token_nll_sum(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, chunk_tokens: Optional[int] = None
) -> torch.Tensor:
    """``Σ_{mask} −log softmax(logits)[label]`` in fp32, for ``logits [..., V]``, ``labels``/``mask [...]``.

    Only the masked positions are evaluated. With ``chunk_tokens``, they are processed in chunks whose fp32
    logits are recomputed in the backward pass instead of stored, so half-precision logits of a long
    response never exist as one fp32 copy.
    """
    if labels.shape != logits.shape[:-1] or mask.shape != labels.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)}, labels {tuple(labels.shape)} and mask {tuple(mask.shape)} "
            "must agree on every axis but the last of logits"
        )
    selected = mask.bool()
    picked_logits = logits[selected]
    picked_labels = labels[selected]
    count = picked_labels.numel()
    if count == 0:
        return logits.sum() * 0.0  # keeps the graph (every rank must run its backward under FSDP)
    if chunk_tokens is None or count <= chunk_tokens:
        return _nll_sum(picked_logits, picked_labels)
    total = picked_logits.new_zeros((), dtype=torch.float32)
    for start in range(0, count, chunk_tokens):
        stop = start + chunk_tokens
        total = total + checkpoint(_nll_sum, picked_logits[start:stop], picked_labels[start:stop], use_reentrant=False)
    return total


def next_token_targets(
    input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which positions to read logits at: ``(positions, labels, mask)``.

    The logit at position t predicts token t+1, so the loss sits at t wherever ``loss_mask[:, t+1]`` is 1.
    ``positions`` are the sequence indices (shared by the micro-batch) with a loss in any row; ``labels``
    and ``mask`` are ``[B, len(positions)]``.
    """
    shifted_mask = loss_mask[:, 1:]
    positions = torch.nonzero(shifted_mask.any(dim=0), as_tuple=True)[0]
    return positions, input_ids[:, positions + 1], shifted_mask[:, positions]


def micro_batch_nll_sum(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], chunk_tokens: Optional[int] = None
) -> torch.Tensor:
    """Summed response-token NLL of one padded micro-batch under an HF causal LM.

    Only the hidden states at loss positions go through the LM head (``logits_to_keep``), so the
    prompt part of a long sequence never produces a vocabulary-sized logit row.
    """
    positions, labels, mask = next_token_targets(batch["input_ids"], batch["loss_mask"])
    if positions.numel() == 0:
        positions = torch.zeros(1, dtype=torch.long, device=batch["input_ids"].device)
        labels, mask = batch["input_ids"][:, :1], torch.zeros_like(batch["input_ids"][:, :1])
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
        logits_to_keep=positions,
    )
    return masked_token_nll_sum(out.logits, labels, mask, chunk_tokens)
