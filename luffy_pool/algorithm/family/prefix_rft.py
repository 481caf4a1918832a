"""Prefix-RFT (arXiv 2507.01679, METHODS_SPEC §7): hybrid rows, a demonstration prefix continued by the policy,
trained inside a Dr.GRPO objective; the prefix share decays by a cosine (0.95 -> 0.05) and only the
highest-entropy prefix tokens (top 20 %) receive gradient.

No public code exists (an index page lists "Code: None"), so this module is written from the paper's summaries.
What the summaries state: the cosine decay of the prefix fraction from 0.95 to 0.05 over training, the Dr.GRPO
update, the restriction of the prefix tokens' gradient to the top 20 % by entropy. What is inferred here and
may differ from the authors' code (each a knob or a documented choice):

- the schedule's argument: ``s = global_step − 1`` over ``S`` decay steps (the run's total steps unless set),
  ``r(s) = r_end + ½(r_start − r_end)(1 + cos(π·min(s, S)/S))``, so the first step uses ``r_start`` exactly;
- the ratio is the same for every prefix slot of the step (not sampled around the schedule);
- the prefix tokens share the PPO ratio ``π_θ/π_old`` and clip of the continuation (the hybrid row is one RL
  sample; not LUFFY's ``f(π_θ)`` with the behaviour policy taken as 1);
- the entropy quantile is per row: of a row's ``k`` valid prefix tokens the ``⌈top_frac·k⌉`` with the largest
  entropy (ties: the earlier position) keep their gradient; the continuation's tokens all keep theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from luffy_pool.algorithm.family.common import aggregate, clipped_on_losses, masked_mean_plain
from luffy_pool.algorithm.family.registry import FamilyLossInputs, register, require


@dataclass(frozen=True)
class PrefixRftConfig:
    """Prefix-RFT's knobs (YAML ``algorithm.prefix_rft``) and the actor's loss keys the loss reads."""

    ratio_start: float = 0.95
    ratio_end: float = 0.05
    decay_steps: int = 500  # YAML null = the run's total steps; 500 = the family's 7B scripts' length
    prefix_entropy_top_frac: float = 0.2
    clip_ratio: float = 0.2
    clip_upper_bound: float = 1.0
    loss_remove_token_mean: bool = True
    loss_remove_clip: bool = False


@register("schedule", "prefix_rft_ratio", config=PrefixRftConfig)
def prefix_ratio(step: int, cfg) -> float:
    """The prefix fraction at ``step`` (0-based): cosine from ``ratio_start`` to ``ratio_end`` over
    ``decay_steps``, ``ratio_end`` after."""
    if cfg.decay_steps < 1:
        raise ValueError(f"prefix_rft decay_steps must be >= 1, got {cfg.decay_steps}")
    progress = min(max(step, 0), cfg.decay_steps) / cfg.decay_steps
    return cfg.ratio_end + 0.5 * (cfg.ratio_start - cfg.ratio_end) * (1.0 + math.cos(math.pi * progress))


def prefix_entropy_mask(
    entropy: torch.Tensor, prefix_mask: torch.Tensor, response_mask: torch.Tensor, top_frac: float
) -> torch.Tensor:
    """``[rows, L]`` float mask: 1 on the ``⌈top_frac·k⌉`` highest-entropy valid prefix tokens of each row
    (``k`` = the row's valid prefix tokens; ties go to the earlier position), 0 elsewhere."""
    if not 0.0 <= top_frac <= 1.0:
        raise ValueError(f"prefix_entropy_top_frac must be in [0, 1], got {top_frac}")
    candidates = prefix_mask.bool() & response_mask.bool()
    count = candidates.sum(-1, keepdim=True)
    # the 1e-6 keeps k = top_frac·count exact where float rounding lands just above an integer (0.2·15)
    keep_count = torch.ceil(count.to(torch.float64) * top_frac - 1e-6).clamp(min=0)
    scores = torch.where(
        candidates, entropy.detach().to(torch.float64), torch.full_like(entropy, -math.inf, dtype=torch.float64)
    )
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return ((ranks < keep_count) & candidates).to(entropy.dtype)


@register("loss", "prefix_rft", config=PrefixRftConfig)
def prefix_rft_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """Dr.GRPO's PPO-clip loss ``max(−A·ρ, −A·clip(ρ, 1−ε, max(clip_upper_bound, 1+ε)))``,
    ``ρ = π_θ/π_old``, over the continuation tokens and the entropy-selected prefix tokens (:func:`prefix_entropy_mask`),
    aggregated ``Σ L·m / L`` (``loss_remove_token_mean``, Dr.GRPO) or as a token mean. Metrics: the kept share
    of prefix tokens, the clip fraction, ``ppo_kl`` over the kept tokens, the prefix tokens' mean entropy."""
    entropy = require(inputs, "entropy", "prefix_rft")
    if inputs.prefix_mask is None:
        raise ValueError("the prefix_rft loss needs inputs.prefix_mask")
    valid = inputs.response_mask.to(inputs.log_prob.dtype)
    prefix = inputs.prefix_mask.bool()
    kept_prefix = prefix_entropy_mask(entropy, prefix, valid, cfg.prefix_entropy_top_frac).to(valid.dtype)
    mask = valid * (~prefix).to(valid.dtype) + kept_prefix
    log_ratio = inputs.log_prob - inputs.old_log_prob
    ratio = torch.exp(log_ratio)
    losses, clipfrac = clipped_on_losses(inputs.advantages, ratio, ratio, mask, cfg)
    loss = aggregate(losses, mask, cfg.loss_remove_token_mean)
    prefix_tokens = (prefix.to(valid.dtype) * valid).sum()
    zero = torch.zeros((), dtype=valid.dtype, device=valid.device)
    return loss, {
        "prefix_rft/kept_prefix_share": kept_prefix.sum() / prefix_tokens if prefix_tokens > 0 else zero,
        "prefix_rft/prefix_entropy": masked_mean_plain(entropy, prefix.to(valid.dtype) * valid)
        if prefix_tokens > 0
        else zero,
        "pg_clipfrac": clipfrac,
        "ppo_kl": masked_mean_plain(-log_ratio, mask) if mask.sum() > 0 else zero,
    }


def decay_steps_of(configured: Optional[int], total_training_steps: int) -> int:
    """``algorithm.prefix_rft.decay_steps``, or the run's total training steps when it is null."""
    return int(configured) if configured is not None else max(int(total_training_steps), 1)
