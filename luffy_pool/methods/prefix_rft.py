"""``algorithm.method=prefix_rft`` (arXiv 2507.01679): hybrid rows, a demonstration prefix continued by the policy,
trained inside a Dr.GRPO objective; the prefix share decays by a cosine (0.95 -> 0.05) and only the
highest-entropy prefix tokens (top 20 %) receive gradient. Its pure blocks first, then the method's wiring.

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

Wiring: each group's ``rollout.n_prefix`` prefix slots (LUFFY's key; ``-1``: every slot) start with the first
``⌊r·len⌋`` tokens of the prompt's demonstration (``data.target_key`` ++ EOS) and the policy continues them, the
other slots are plain rollouts; LUFFY's ``min/max_prefix_ratio`` and ``prefix_strategy`` are not read. Advantage:
``grpo`` over the whole group (hybrid rows are group members, as the paper's single RL objective); Dr.GRPO's
no-std and sum / L aggregation are the launch script's (``grpo_use_std=False``, ``loss_remove_token_mean=True``).
State: the step only (the trainer's ``global_steps``, restored on resume); the sampler has no RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from verl.utils.config_section import AT_LEAST_ONE, UNIT, key
from luffy_pool.methods.loss_helpers import aggregate, clipped_on_losses, masked_mean_plain
from luffy_pool.methods.loss_inputs import FamilyLossInputs, require


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


@dataclass(frozen=True)
class PrefixRftKnobs:
    """``algorithm.prefix_rft``: Prefix-RFT's prefix schedule and entropy mask."""

    ratio_start: float = key(
        bounds=UNIT, default=0.95, doc="Prefix share on the first step (cosine schedule start). Paper: 0.95."
    )
    ratio_end: float = key(
        bounds=UNIT, default=0.05, doc="Prefix share at and after decay_steps (cosine schedule end). Paper: 0.05."
    )
    decay_steps: Optional[int] = key(
        bounds=AT_LEAST_ONE,
        default=None,
        doc="Steps of the cosine decay; null: the run's total training steps (the paper decays over training).",
    )
    prefix_entropy_top_frac: float = key(
        bounds=UNIT,
        default=0.2,
        doc="Share of each row's prefix tokens, those of highest entropy, that take gradient. Paper: 0.2.",
    )


def prefix_rft_method_loss(inputs: FamilyLossInputs, knobs: PrefixRftKnobs, step: int):
    """The loss reads only the entropy share and the actor's clip / aggregation (the schedule is the hook's)."""
    loss = inputs.settings
    cfg = PrefixRftConfig(
        prefix_entropy_top_frac=knobs.prefix_entropy_top_frac,
        clip_ratio=loss.clip_ratio,
        clip_upper_bound=loss.clip_upper_bound,
        loss_remove_token_mean=loss.loss_remove_token_mean,
        loss_remove_clip=loss.loss_remove_clip,
    )
    return prefix_rft_loss(inputs, cfg)


class PrefixRftSampler(StepHooks):
    """Prefix ratios ``[B, n]``: the step's cosine-scheduled fraction on the first ``n_prefix`` slots of each
    prompt (all ``n`` when ``n_prefix = −1``), 0 on the others."""

    KIND = name = "prefix_rft"

    def __init__(self, n: int, n_prefix: int, cfg):
        self.n, self.cfg = n, cfg
        self.n_prefix = n if n_prefix == -1 else n_prefix

    @classmethod
    def from_sections(cls, sections, *, seed: int, total_steps: int, tokenizer=None) -> "PrefixRftSampler":
        knobs, rollout = sections.knobs, sections.workers.rollout
        cfg = PrefixRftConfig(
            ratio_start=knobs.ratio_start,
            ratio_end=knobs.ratio_end,
            decay_steps=decay_steps_of(knobs.decay_steps, total_steps),
            prefix_entropy_top_frac=knobs.prefix_entropy_top_frac,
        )
        return cls(rollout.n, rollout.n_prefix, cfg)

    def ratio(self, global_step: int) -> float:
        if global_step < 1:
            raise ValueError(f"global_step counts training steps from 1, got {global_step}")
        return prefix_ratio(global_step - 1, self.cfg)

    def draw_batch(self, batch, global_step: int) -> tuple[np.ndarray, dict]:
        r = self.ratio(global_step)
        ratios = np.zeros((len(batch), self.n), dtype=np.float64)
        ratios[:, : self.n_prefix] = r
        return ratios, {"prefix_rft/prefix_ratio": r}

    @classmethod
    def from_context(cls, context) -> "PrefixRftSampler":
        return cls.from_sections(context.sections, seed=0, total_steps=context.total_steps)

    def plan_slots(self, batch, gen_batch, ratios, step: int):
        return self.draw_batch(batch, step)

    def state_dict(self) -> dict:
        return {"kind": self.KIND}

    def load_state_dict(self, state) -> None:
        if state.get("kind") != self.KIND:
            kind = state.get("kind", "LUFFY PrefixRatioSampler")
            raise ValueError(
                f"the checkpoint's prefix-ratio sampler is {kind!r}, "
                f"not algorithm.method=prefix_rft's; resume it with the method it was trained with"
            )


PREFIX_RFT = register_method(
    Method(
        name="prefix_rft",
        mechanism="demonstration prefix (cosine 0.95 -> 0.05) + on-policy continuation, "
        "Dr.GRPO with only the top-20% entropy prefix tokens trained",
        knobs=PrefixRftKnobs,
        loss=prefix_rft_method_loss,
        hooks=PrefixRftSampler.from_context,
        needs_demonstration=True,
    )
)
