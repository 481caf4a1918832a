"""Small tensor functions shared by the actor, the driver and the loss code.

Masked statistics over response tokens, log-probabilities and entropy from logits, EOS/position masks,
padding of ragged token lists and the learning-rate schedules of the actor optimizer. Everything here is
a pure function of its inputs (the schedules return a ``LambdaLR`` bound to the given optimizer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_mean_or_zero",
    "masked_var",
    "masked_whiten",
    "logprobs_from_logits",
    "entropy_from_logits",
    "logprobs_and_entropy_from_logits",
    "get_eos_mask",
    "compute_position_id_with_mask",
    "pad_2d_list_to_length",
    "clip_by_value",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
]


# ----------------------------------------------------------------------------------------------------
# Masked statistics
# ----------------------------------------------------------------------------------------------------
def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """``Σ values·mask`` over ``axis`` (all elements when ``axis`` is None)."""
    product = values * mask
    return product.sum() if axis is None else product.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """``Σ values·mask / Σ mask`` over ``axis``; like torch, an empty mask gives NaN.

    Use :func:`masked_mean_or_zero` where an empty selection is a normal case (e.g. a micro-batch
    without off-policy tokens).
    """
    return masked_sum(values, mask, axis) / masked_sum(torch.ones_like(values), mask, axis)


def masked_mean_or_zero(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Like :func:`masked_mean` but 0 (with a zero, finite gradient) where ``Σ mask == 0``."""
    total = masked_sum(values, mask, axis)
    count = masked_sum(torch.ones_like(values), mask, axis)
    nonempty = count > 0
    # Dividing by 1 where empty keeps the backward pass free of 0/0.
    return torch.where(nonempty, total / torch.where(nonempty, count, torch.ones_like(count)), torch.zeros_like(total))


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements: ``mean_m((x − mean_m(x))²)``, times ``n/(n−1)`` if unbiased.

    Raises ValueError when the mask selects nothing, or a single element with ``unbiased=True``.
    """
    count = mask.sum()
    if count == 0:
        raise ValueError("masked_var: the mask selects no element")
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        if count == 1:
            raise ValueError("masked_var: unbiased variance needs at least 2 masked elements, got 1")
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x − μ)/sqrt(σ² + 1e-8)`` with masked μ and unbiased σ²; adds μ back if ``shift_mean=False``."""
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    return whitened if shift_mean else whitened + mean


# ----------------------------------------------------------------------------------------------------
# Log-probabilities and entropy
# ----------------------------------------------------------------------------------------------------
def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[label] = logits[label] − logsumexp(logits)`` for logits ``[..., V]``.

    fp32/fp64 logits use the logsumexp form, which never materialises a ``[..., V]`` log-softmax.
    Half-precision logits are processed one row at a time in fp32 (logsumexp in bf16 loses too
    much precision) and the result is fp32.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal the logits shape without the vocab axis "
            f"{tuple(logits.shape[:-1])}"
        )
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    rows = [F.log_softmax(row.float(), dim=-1)[label] for row, label in zip(flat_logits, flat_labels)]
    out = torch.stack(rows) if rows else flat_logits.new_zeros(0, dtype=torch.float32)
    return out.reshape(labels.shape)


def logprobs_and_entropy_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs_from_logits, entropy_from_logits)`` of the same logits in one pass.

    fp32/fp64 logits go through one ``log_softmax`` shared by both (``entropy = −Σ p·log p``), where the
    separate functions each normalise the logits again: half the vocabulary-sized work in forward and
    backward of the actor's loss. Half-precision logits use the two functions.
    """
    if logits.dtype not in (torch.float32, torch.float64):
        return logprobs_from_logits(logits, labels), entropy_from_logits(logits)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal the logits shape without the vocab axis "
            f"{tuple(logits.shape[:-1])}"
        )
    log_p = F.log_softmax(logits, dim=-1)
    picked = torch.gather(log_p, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked, -(log_p.exp() * log_p).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last axis: ``logsumexp(l) − Σ softmax(l)·l``."""
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


# ----------------------------------------------------------------------------------------------------
# Masks, positions, padding
# ----------------------------------------------------------------------------------------------------
def get_eos_mask(
    response_id: torch.Tensor, eos_token: int | Sequence[int] = 2, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """Response mask ``[B, L]``: 1 up to and including the first EOS of each row, 0 after it.

    ``eos_token`` may be one id or a list of ids (any of them ends the response). A row without EOS
    is all ones.
    """
    eos_ids = [eos_token] if isinstance(eos_token, int) else list(eos_token)
    if not eos_ids:
        raise ValueError("get_eos_mask: eos_token list is empty")
    is_eos = torch.isin(response_id, torch.tensor(eos_ids, device=response_id.device)).long()
    # Number of EOS strictly before each position: 0 means "still inside the response".
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos
    return (eos_before == 0).to(dtype)


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a (left-)padded attention mask: ``max(cumsum(mask) − 1, 0)``."""
    return torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)


def pad_2d_list_to_length(
    response: Sequence[Sequence[int]], pad_token_id: int, max_length: int | None = None
) -> torch.Tensor:
    """Right-pad token lists with ``pad_token_id`` into a LongTensor ``[N, W]``.

    ``W = max_length`` when given (a longer list raises ValueError naming its row), else the longest
    list's length.
    """
    longest = max((len(row) for row in response), default=0)
    width = longest if max_length is None else max_length
    if longest > width:
        row = next(i for i, r in enumerate(response) if len(r) > width)
        raise ValueError(f"pad_2d_list_to_length: row {row} has {len(response[row])} tokens > max_length={width}")
    padded = [list(row) + [pad_token_id] * (width - len(row)) for row in response]
    return torch.tensor(padded, dtype=torch.long).reshape(len(padded), width)


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Element-wise ``min(max(x, tensor_min), tensor_max)`` with tensor bounds."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


# ----------------------------------------------------------------------------------------------------
# Learning-rate schedules
# ----------------------------------------------------------------------------------------------------
def _warmup_factor(step: int, num_warmup_steps: int, zero_lr_first_step: bool) -> float:
    """Linear warm-up multiplier: ``(step+1)/w`` (ours) or ``step/max(1,w)`` (verl v0.2 / LUFFY)."""
    if zero_lr_first_step:
        return min(1.0, step / max(1, num_warmup_steps))
    if num_warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / num_warmup_steps)


def get_constant_schedule_with_warmup(
    optimizer: torch.optim.Optimizer, num_warmup_steps: int, zero_lr_first_step: bool = False, last_epoch: int = -1
) -> LambdaLR:
    """Constant LR after a linear warm-up of ``num_warmup_steps`` scheduler steps.

    Default: ``λ(s) = min(1, (s+1)/w)`` (``λ ≡ 1`` when ``w = 0``), so the first update already
    moves the weights. Deviation from LUFFY (docs/METHOD.md §1.9, §7 item 6): LUFFY's verl uses
    ``λ(s) = min(1, s/max(1, w))``, which is 0 at step 0 even with ``w = 0``, i.e. its first training
    step runs with lr = 0. ``zero_lr_first_step=True`` reproduces that exactly.
    """
    if num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps must be >= 0, got {num_warmup_steps}")
    return LambdaLR(
        optimizer, lambda step: _warmup_factor(step, num_warmup_steps, zero_lr_first_step), last_epoch=last_epoch
    )


def get_cosine_schedule_with_warmup(
    optimizer: torch.optim.Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    zero_lr_first_step: bool = False,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warm-up, then cosine decay from 1 to ``min_lr_ratio``.

    After warm-up, with ``q = (s − w)/max(1, T − w)``:
    ``λ(s) = max(0, r + (1 − r)·(1 + cos(2π·num_cycles·q))/2)``, ``r = min_lr_ratio``.
    Warm-up is ``min(1, (s+1)/w)`` by default; ``zero_lr_first_step=True`` uses verl's ``s/max(1, w)``
    (0 at step 0 when ``w > 0``; with ``w = 0`` verl's cosine starts at 1 either way).
    """
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    if num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps must be >= 0, got {num_warmup_steps}")

    def lr_lambda(step: int) -> float:
        if step < num_warmup_steps:
            return _warmup_factor(step, num_warmup_steps, zero_lr_first_step)
        progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))
        return max(0.0, min_lr_ratio + (1.0 - min_lr_ratio) * cosine)

    return LambdaLR(optimizer, lr_lambda, last_epoch=last_epoch)
