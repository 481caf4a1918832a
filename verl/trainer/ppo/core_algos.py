"""Advantage estimators and the PPO policy loss, as pure tensor functions registered by name.

The driver looks an estimator up with :func:`get_adv_estimator_fn` (``algorithm.adv_estimator``) and
the actor a loss with :func:`get_policy_loss_fn` (``actor.policy_loss``, luffy_pool/loss_config.py), each
called with :func:`call_with_supported_kwargs` (one vocabulary of keyword names per registry; a loss returns
a dict with ``pg_loss``); LUFFY's mixed estimator and token loss register
themselves from ``luffy_pool.mix_core_alg``. KL helpers live in :mod:`verl.trainer.ppo.kl` and are
re-exported here under their verl names.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from verl.trainer.ppo.kl import (  # noqa: F401  (re-exported: verl/LUFFY call them as core_algos.*)
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from verl.utils import torch_functional as verl_F

ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., Any]] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable[..., Any]] = {}
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ----------------------------------------------------------------------------------------------------
# Registries
# ----------------------------------------------------------------------------------------------------
def _register(registry: dict[str, Callable[..., Any]], kind: str, name: str) -> Callable[[Callable], Callable]:
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        previous = registry.get(name)
        # A module reload re-registers the same function; a different function under the name is a bug.
        if previous is not None and (previous.__module__, previous.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"{kind} {name!r} is already registered to {previous.__module__}.{previous.__qualname__}")
        registry[name] = fn
        return fn

    return decorator


def _lookup(registry: dict[str, Callable[..., Any]], kind: str, name: str) -> Callable[..., Any]:
    if name not in registry:
        hint = " ('grpo_split'/'luffy_token' register on `import luffy_pool.mix_core_alg`)"
        raise ValueError(f"unknown {kind} {name!r}; valid: {sorted(registry)}{hint}")
    return registry[name]


def register_adv_est(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under ``algorithm.adv_estimator`` = ``name``."""
    return _register(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def get_adv_estimator_fn(name: str) -> Callable[..., Any]:
    """The estimator registered as ``name``; ValueError listing the valid names otherwise."""
    return _lookup(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under ``name``."""
    return _register(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_fn(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name``; ValueError listing the valid names otherwise."""
    return _lookup(POLICY_LOSS_REGISTRY, "policy loss", name)


def call_with_supported_kwargs(fn: Callable[..., Any], **available: Any) -> Any:
    """Call ``fn`` with those of ``available`` that it accepts.

    Lets the driver offer every input it has (values, on_policy_mask, gamma, ...) to any registered
    estimator; a required parameter that is not offered raises ValueError naming it.
    """
    params = inspect.signature(fn).parameters
    missing = [
        name for name, p in params.items()
        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and available.get(name) is None
    ]
    if missing:
        raise ValueError(f"{fn.__name__} needs {missing}, which the caller did not provide")
    return fn(**{k: v for k, v in available.items() if k in params})


# ----------------------------------------------------------------------------------------------------
# Advantage estimators
# ----------------------------------------------------------------------------------------------------
def sequence_scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """Outcome score per sequence: ``s_i = Σ_t token_level_rewards[i, t]`` (shape ``[bs]``)."""
    return token_level_rewards.sum(dim=-1)


def group_normalized_scores(
    scores: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = 1e-6,
    use_std: bool = True,
    stats_mask: torch.Tensor | None = None,
    zero_std_as_one: bool = False,
) -> torch.Tensor:
    """``(s_i − μ_G)/(σ_G + ε)`` (or ``s_i − μ_G`` without std) for the group ``G`` of row ``i``.

    Rows sharing ``index[i]`` form a group. μ and the unbiased σ are taken over the group rows where
    ``stats_mask`` is True (all rows by default); a group with one such row uses μ=0, σ=1, and
    ``zero_std_as_one`` replaces σ=0 by 1. Every row of the group is normalised with these statistics.
    """
    if len(index) != scores.shape[0]:
        raise ValueError(f"index has {len(index)} entries but the batch has {scores.shape[0]} rows")
    group_of_row = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)[1]
    group_of_row = torch.as_tensor(group_of_row.reshape(-1), device=scores.device)
    in_stats = torch.ones_like(scores, dtype=torch.bool) if stats_mask is None else stats_mask.bool()
    advantages = torch.empty_like(scores)
    for group in torch.unique(group_of_row):
        rows = group_of_row == group
        members = scores[rows & in_stats]
        if members.numel() == 0:
            raise ValueError(f"group {index[int(rows.nonzero()[0])]!r} has no row to compute its statistics from")
        if members.numel() == 1:
            mean, std = scores.new_tensor(0.0), scores.new_tensor(1.0)
        else:
            mean, std = members.mean(), members.std()
            if zero_std_as_one and std.item() == 0:
                std = scores.new_tensor(1.0)
        centered = scores[rows] - mean
        advantages[rows] = centered / (std + epsilon) if use_std else centered
    return advantages


def broadcast_sequence_advantage(
    seq_advantage: torch.Tensor, eos_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast one value per row to its response tokens: ``A[i, t] = a_i·m[i, t]``; returns = A."""
    advantages = seq_advantage.unsqueeze(-1) * eos_mask
    return advantages, advantages


@register_adv_est("grpo")
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    eos_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = 1e-6,
    use_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (spec §1.7): every row of the uid group is in the statistics.

    ``A_i = (s_i − μ_G)/(σ_G + ε)`` with unbiased σ, or ``s_i − μ_G`` when ``use_std=False``
    (LUFFY: ``grpo_use_std=False``); a group of one row uses μ=0, σ=1. ``index`` holds the uid per row.
    """
    seq_adv = group_normalized_scores(sequence_scores(token_level_rewards), index, epsilon, use_std)
    return broadcast_sequence_advantage(seq_adv, eos_mask)


@register_adv_est("reinforce")
@torch.no_grad()
def compute_reinforce_outcome_advantage(
    token_level_rewards: torch.Tensor, eos_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain REINFORCE: the raw sequence score as advantage, no baseline: ``A[i, t] = s_i·m[i, t]``."""
    return broadcast_sequence_advantage(sequence_scores(token_level_rewards), eos_mask)


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, eos_mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return ``G_t = r_t + γ·G_{t+1}`` (reset past the mask), whitened over
    all valid tokens of the batch: ``A = masked_whiten(G, m)·m``; returns = G."""
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * eos_mask[:, t]
    advantages = verl_F.masked_whiten(returns, eos_mask) * eos_mask
    return advantages, returns


@register_adv_est("gae")
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor | None,
    eos_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (needs a critic's ``values``).

    ``δ_t = r_t + γ·V_{t+1} − V_t`` (V beyond the last column = 0), ``Â_t = δ_t + γλ·Â_{t+1}``,
    returns ``= Â + V``; advantages are then whitened over valid tokens. Both are multiplied by the mask.
    """
    if values is None:
        raise ValueError("adv_estimator='gae' needs critic values; configure a critic or use grpo/reinforce")
    next_advantage = torch.zeros_like(token_level_rewards[:, 0])
    reversed_advantages = []
    length = token_level_rewards.shape[1]
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t < length - 1 else torch.zeros_like(values[:, t])
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        reversed_advantages.append(next_advantage)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    returns = (advantages + values) * eos_mask
    advantages = verl_F.masked_whiten(advantages, eos_mask) * eos_mask
    return advantages, returns


# ----------------------------------------------------------------------------------------------------
# Policy loss and aggregation
# ----------------------------------------------------------------------------------------------------
def aggregate_token_loss(loss_mat: torch.Tensor, mask: torch.Tensor, loss_remove_token_mean: bool) -> torch.Tensor:
    """LUFFY's aggregation: ``Σ L·m / L_width`` (``L_width`` = response tensor width) when
    ``loss_remove_token_mean``, else the token mean ``Σ L·m / Σ m`` (0 for an empty mask)."""
    if loss_remove_token_mean:
        return (loss_mat * mask).sum() / mask.shape[-1]
    return verl_F.masked_mean_or_zero(loss_mat, mask)


@register_policy_loss("vanilla")
def ppo_clip_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    eos_mask: torch.Tensor,
    cliprange: float,
    loss_remove_token_mean: bool = False,
    loss_remove_clip: bool = False,
) -> dict[str, torch.Tensor]:
    """PPO clipped surrogate -> ``{pg_loss, pg_clipfrac, ppo_kl}`` (the registry's form).

    ``ρ = exp(ℓ − ℓ_old)``, ``L = max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε))``, or ``L = −A·ρ`` with
    ``loss_remove_clip`` (clipfrac 0). Aggregated by :func:`aggregate_token_loss`. No ``clip_upper_bound``:
    LUFFY's ``core_algos.compute_policy_loss`` (the plain PPO and SFT-multitask paths) has none; only its
    off-policy token loss reads that key (review E6).
    ``pg_clipfrac`` = share of valid tokens where the clipped term is larger;
    ``ppo_kl = masked_mean(ℓ_old − ℓ)``.
    """
    log_ratio = log_prob - old_log_prob
    ppo_kl = verl_F.masked_mean_or_zero(-log_ratio, eos_mask)
    pg_losses, pg_clipfrac = clipped_pg_losses(advantages, torch.exp(log_ratio), eos_mask, cliprange,
                                               remove_clip=loss_remove_clip)
    return {"pg_loss": aggregate_token_loss(pg_losses, eos_mask, loss_remove_token_mean), "pg_clipfrac": pg_clipfrac,
            "ppo_kl": ppo_kl}


def compute_policy_loss(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's tuple form of :func:`ppo_clip_policy_loss` (same arguments): ``(pg_loss, pg_clipfrac, ppo_kl)``."""
    out = ppo_clip_policy_loss(*args, **kwargs)
    return out["pg_loss"], out["pg_clipfrac"], out["ppo_kl"]


def clipped_pg_losses(
    advantages: torch.Tensor,
    ratio: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    clip_upper_bound: float = 1.0,
    remove_clip: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate ``max(−A·ρ, −A·clip(ρ, 1−ε, max(clip_upper_bound, 1+ε)))`` and the clip
    fraction over ``mask`` (share of tokens where the clipped term is larger); ``−A·ρ`` and 0 with
    ``remove_clip``."""
    losses = -advantages * ratio
    if remove_clip:
        return losses, torch.zeros((), device=ratio.device)
    upper = max(clip_upper_bound, 1.0 + cliprange)
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, upper)
    clipfrac = verl_F.masked_mean_or_zero(torch.gt(clipped, losses).float(), mask)
    return torch.max(losses, clipped), clipfrac


def agg_loss(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, loss_scale_factor: float | None = None
) -> torch.Tensor:
    """Reduce a ``[bs, L]`` token loss to a scalar (upstream verl's ``loss_agg_mode``).

    ``token-mean``: ``Σ L·m / Σ m``; ``seq-mean-token-sum``: mean over rows of ``Σ_t L·m``;
    ``seq-mean-token-mean``: mean over rows of the row token mean; ``seq-mean-token-sum-norm``:
    ``Σ L·m / loss_scale_factor`` (default: the width L, = LUFFY's ``loss_remove_token_mean``).
    Seq-means skip rows without valid tokens; every mode gives 0 for an all-empty mask.
    """
    row_sums = (loss_mat * loss_mask).sum(dim=-1)
    row_counts = loss_mask.sum(dim=-1)
    valid_rows = (row_counts > 0).to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return verl_F.masked_mean_or_zero(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return verl_F.masked_mean_or_zero(row_sums, valid_rows)
    if loss_agg_mode == "seq-mean-token-mean":
        row_means = row_sums / torch.where(row_counts > 0, row_counts, torch.ones_like(row_counts))
        return verl_F.masked_mean_or_zero(row_means, valid_rows)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return row_sums.sum() / scale
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {list(LOSS_AGG_MODES)}")


def compute_entropy_loss(logits: torch.Tensor, eos_mask: torch.Tensor) -> torch.Tensor:
    """Mean full-vocabulary entropy over valid tokens: ``masked_mean(H(softmax(logits)), m)``."""
    return verl_F.masked_mean_or_zero(verl_F.entropy_from_logits(logits), eos_mask)
