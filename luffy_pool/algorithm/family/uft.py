"""UFT (arXiv 2505.16984): a prefix of the solution ("hint") appended to the prompt, its expected length
annealed by a cosine over the first ``T_hint`` steps, and a small NLL on the hint tokens.

Mirrors liumy2010/UFT (commit ad3c8ec7): ``verl/utils/dataset/rl_dataset.py`` ``RLHFDataset.__getitem__``
(hint sampling) -> :func:`hint_probability`, :func:`cut_points`, :func:`stage_index`,
:func:`sample_hint`; ``verl/utils/torch_functional.py`` ``tokenize_and_postprocess_data`` ->
:func:`tokenize_with_hint`; the hint cross-entropy lines of ``verl/workers/actor/dp_actor.py``
``update_policy`` (with their ``masked_mean``, denominator clamped to ≥ 1e-6) -> :func:`hint_nll_loss`.
METHODS_SPEC §6.

Quirks kept: at most 5 segments whatever the solution length, cut points ``round(j/m·n)`` with Python's
round-half-to-even; the hint length is a sum of ``m`` Bernoulli(p) draws made with ``rng.choice([0, 1],
p=[1−p, p], size=m)`` (same numpy stream as theirs); ``t`` starts at 1 and ``p(T_hint) = p_low``, 0 after;
the hint is tokenised separately and concatenated after the prompt (not tokenised jointly); the hint mask
marks the positions whose *next* token is a hint token (``[−h−1:−1]``), padded and truncated with the ids.
The hint NLL clamps the (temperature-divided) prompt logits to [−100, 100] and is 0 without hint tokens.
Fixed: a row whose hint list is empty gets no hint (theirs divides by zero).
:func:`split_solution` is ours: a lossless pre-processor cutting a full solution into line segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from luffy_pool.algorithm.family.registry import register

SCHEDULES = ("cosine", "stage", "uniform")


@dataclass(frozen=True)
class UftConfig:
    """UFT's hint knobs (``run.py`` defaults: T_hint 300, p 0.95 -> 0.05, β = 0.001)."""

    schedule: str = "cosine"
    total_training_steps_hint: int = 300
    lower_prob: float = 0.05
    upper_prob: float = 0.95
    max_segments: int = 5
    hint_sft_coef: float = 0.001


@register("schedule", "uft_hint", config=UftConfig)
def hint_probability(step: int, cfg) -> float:
    """``p(t) = p_low + ½(p_high − p_low)(1 + cos(π t / T_hint))`` for ``t ≤ T_hint``, else 0."""
    if step > cfg.total_training_steps_hint:
        return 0.0
    return cfg.lower_prob + 0.5 * (cfg.upper_prob - cfg.lower_prob) * (
        1 + np.cos(np.pi * step / cfg.total_training_steps_hint)
    )


def cut_points(n_segments: int, max_segments: int = 5) -> list[int]:
    """``[round(j/m · n) for j = 0..m]`` with ``m = min(max_segments, n)``, the last forced to ``n``."""
    m = min(max_segments, n_segments)
    points = [round(j / m * n_segments) for j in range(m + 1)]
    points[-1] = n_segments
    return points


def stage_index(step: int, m: int, cfg) -> int:
    """Stage ablation: ``clip(m − ⌊t / ⌊T_hint/(m+1)⌋⌋, 0, m)`` for ``t ≤ T_hint``, else 0."""
    if step > cfg.total_training_steps_hint:
        return 0
    return int(np.clip(m - step // (cfg.total_training_steps_hint // (m + 1)), 0, m))


def sample_hint(hint: Sequence[str] | None, step: int, cfg, rng: np.random.RandomState) -> tuple[str, float]:
    """``(hint text, share of segments used)`` for one dataset item at ``step``: the first ``s_j`` segments,
    ``j`` from the schedule (``cosine``: Binomial(m, p(t)); ``stage``: :func:`stage_index`; ``uniform``: a
    uniformly drawn cut point)."""
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"unknown uft schedule {cfg.schedule!r}; valid: {list(SCHEDULES)}")
    if hint is None or len(hint) == 0:
        return "", 0.0
    m = min(cfg.max_segments, len(hint))
    points = cut_points(len(hint), cfg.max_segments)
    if cfg.schedule == "uniform":
        length = rng.choice(points)
    elif cfg.schedule == "stage":
        length = points[stage_index(step, m, cfg)] if step <= cfg.total_training_steps_hint else 0
    elif step > cfg.total_training_steps_hint:
        length = 0
    else:
        p = hint_probability(step, cfg)
        length = points[rng.choice([0, 1], p=[1.0 - p, p], size=len(points) - 1).sum()]
    return "".join(hint[:length]), length / len(hint)


def _pad(t: torch.Tensor, length: int, value: int, left: bool) -> torch.Tensor:
    if t.shape[-1] >= length:
        return t
    gap = length - t.shape[-1]
    return F.pad(t, (gap, 0) if left else (0, gap), "constant", value)


def tokenize_with_hint(
    prompt: str,
    hint_text: str,
    tokenizer,
    max_length: int,
    pad_token_id: int,
    left_pad: bool = True,
    truncation: str = "error",
):
    """``(input_ids, attention_mask, hint_ids, hint_mask)``, each ``[1, ·]``: prompt and hint tokenised
    separately (no special tokens) and concatenated; ``hint_mask`` is 1 on the ``h`` positions before the last
    (next token is a hint token); padded to ``max_length`` or truncated (``left``/``right``; ``error`` raises)."""
    if truncation not in ("left", "right", "error"):
        raise ValueError(f"truncation must be left, right or error, got {truncation!r}")
    data = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    input_ids, attention_mask = data["input_ids"], data["attention_mask"]
    hint_ids = torch.tensor([[]], dtype=torch.long)
    hint_length = 0
    if hint_text != "":
        hint = tokenizer(hint_text, return_tensors="pt", add_special_tokens=False)
        hint_ids = hint["input_ids"]
        input_ids = torch.cat([input_ids, hint_ids], dim=-1)
        attention_mask = torch.cat([attention_mask, hint["attention_mask"]], dim=-1)
        hint_length = hint_ids.shape[-1]
    hint_mask = torch.zeros_like(attention_mask)
    hint_mask[:, -hint_length - 1 : -1] = 1
    length = input_ids.shape[-1]
    if length < max_length:
        input_ids = _pad(input_ids, max_length, pad_token_id, left_pad)
        attention_mask = _pad(attention_mask, max_length, 0, left_pad)
        hint_mask = _pad(hint_mask, max_length, 0, left_pad)
    elif length > max_length:
        if truncation == "error":
            raise ValueError(f"prompt + hint is {length} tokens, max_prompt_length is {max_length}")
        window = slice(-max_length, None) if truncation == "left" else slice(None, max_length)
        input_ids, attention_mask, hint_mask = input_ids[:, window], attention_mask[:, window], hint_mask[:, window]
    return input_ids, attention_mask, hint_ids, hint_mask


def split_solution(solution: str) -> list[str]:
    """A full solution cut into line segments (each keeps its newline), ``"".join`` gives it back; blank lines
    stay attached to the preceding segment. Feeds :func:`sample_hint` for data without a ``hint`` column."""
    segments: list[str] = []
    for line in solution.splitlines(keepends=True):
        if segments and line.strip() == "":
            segments[-1] += line
        else:
            segments.append(line)
    return segments


def hint_nll_loss(prompt_logits: torch.Tensor, prompt_ids: torch.Tensor, hint_mask: torch.Tensor) -> torch.Tensor:
    """UFT's hint term (β = ``hint_sft_coef`` multiplies it outside): the mean over hint positions of the
    cross-entropy of the next prompt token under ``clamp(prompt_logits, ±100)``. ``prompt_logits`` [B, P, V]
    (already divided by the temperature), ``prompt_ids`` and ``hint_mask`` [B, P] as :func:`tokenize_with_hint`
    returns them; 0 when no position is a hint position."""
    vocab = prompt_logits.shape[-1]
    logits = torch.clamp(prompt_logits[:, :-1, :].reshape(-1, vocab), min=-100, max=100)
    labels = prompt_ids[:, 1:].reshape(-1).to(logits.device)
    losses = F.cross_entropy(logits, labels, reduction="none")
    mask = hint_mask[:, :-1].reshape(-1)
    return (losses * mask).sum() / torch.clamp(mask.sum(), min=1e-6)


@dataclass(frozen=True)
class UftLossConfig:
    """The UFT loss's knobs: β (``hint_sft_coef``) and the actor's PPO clip and aggregation."""

    hint_sft_coef: float = 0.001
    clip_ratio: float = 0.2
    clip_upper_bound: float = 1.0
    loss_remove_token_mean: bool = False  # UFT's verl: token mean
    loss_remove_clip: bool = False


@register("loss", "uft", config=UftLossConfig)
def uft_loss(inputs, cfg) -> tuple[torch.Tensor, dict]:
    """UFT's actor loss with the hint as the response's prefix tokens (``prefix_mask``): PPO-clip GRPO on the
    continuation tokens (the hint tokens take no policy gradient, as UFT's hint is prompt) plus
    ``β·mean_{hint tokens}(−ℓ_t)``, the mean over the micro-batch's hint tokens with the denominator clamped to
    ≥ 1e-6 as :func:`hint_nll_loss` (0 without hint tokens). ``ℓ_t`` is the actor's temperature-divided
    log-prob of the hint token, the same value UFT's shifted prompt logits give, without their ±100 clamp."""
    from luffy_pool.algorithm.family.common import aggregate, clipped_on_losses, masked_mean_plain

    if inputs.prefix_mask is None:
        raise ValueError("the uft loss needs inputs.prefix_mask (the hint tokens)")
    valid = inputs.response_mask.to(inputs.log_prob.dtype)
    hint = inputs.prefix_mask.to(valid.dtype) * valid
    cont = valid - hint
    log_ratio = inputs.log_prob - inputs.old_log_prob
    ratio = torch.exp(log_ratio)
    losses, clipfrac = clipped_on_losses(inputs.advantages, ratio, ratio, cont, cfg)
    zero = torch.zeros((), dtype=valid.dtype, device=valid.device)
    pg_loss = aggregate(losses, cont, cfg.loss_remove_token_mean) if cont.sum() > 0 else zero
    hint_nll = (-inputs.log_prob * hint).sum() / torch.clamp(hint.sum(), min=1e-6)
    return pg_loss + cfg.hint_sft_coef * hint_nll, {
        "uft/pg_loss": pg_loss,
        "uft/hint_nll": hint_nll,
        "pg_clipfrac": clipfrac if cont.sum() > 0 else zero,
        "ppo_kl": masked_mean_plain(-log_ratio, cont) if cont.sum() > 0 else zero,
    }
