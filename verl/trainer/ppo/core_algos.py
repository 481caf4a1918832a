"""Advantage estimators and the PPO policy loss, as pure tensor functions registered by name.

One call shape per registry (verl/trainer/ppo/loss_inputs.py): a registered estimator is
``fn(AdvantageInputs, AdvantageConfig) -> (advantages, returns)`` and returns verl's advantage (a trainer applies
its own post-processing after it, once); a registered policy loss is ``fn(PolicyLossInputs, cfg) ->
(loss, metrics)`` and declares at registration which tokens its metrics average over and whether it takes rollout
correction's weights and bypass mode. Both actors select theirs with :func:`resolve_policy_loss` /
:func:`get_policy_loss_fn` / :func:`policy_loss_config` (``actor.policy_loss``), the trainer with
:func:`get_adv_estimator_fn` (``algorithm.adv_estimator``). verl's functions keep their names and arguments here
as thin aliases over the registered ones (``compute_grpo_outcome_advantage``, ``compute_policy_loss``, ...), with
verl's ``agg_loss`` / ``compute_entropy_loss``, for users' scripts. A trainer package registers its own
estimators and losses when it is imported. KL helpers live in :mod:`verl.trainer.ppo.kl`, re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, is_dataclass
from typing import Any, Optional

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
from verl.trainer.ppo.loss_inputs import (  # noqa: F401  (resolve_policy_loss re-exported for the actors)
    BYPASS_LOSSES,
    GRPO_EPSILON,
    POLICY_LOSS_CONFIGS,
    POLICY_LOSS_SWITCHES,
    ROLLOUT_IS_LOSSES,
    AdvantageConfig,
    AdvantageInputs,
    PolicyLossInputs,
    resolve_policy_loss,
)
from verl.utils import torch_functional as verl_F
from verl.utils.step_metrics import LOSS_METRIC_TOKENS, METRIC_TOKEN_SETS

ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., Any]] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable[..., Any]] = {}


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
        hint = " (a trainer package's own register when it is imported; a user's through model.external_lib)"
        raise ValueError(f"unknown {kind} {name!r}; valid: {sorted(registry)}{hint}")
    return registry[name]


def register_adv_est(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(AdvantageInputs, cfg) -> (advantages, returns)`` as
    ``algorithm.adv_estimator`` = ``name``; ``cfg`` is the ``algorithm`` section."""
    return _register(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def get_adv_estimator_fn(name: str) -> Callable[..., Any]:
    """The estimator registered as ``name``; ValueError listing the valid names otherwise."""
    return _lookup(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def register_policy_loss(
    name: str,
    config: Optional[type] = None,
    auto_switch: Optional[str] = None,
    metric_tokens: Optional[Mapping[str, str]] = None,
    supports_rollout_is: bool = False,
    supports_bypass_mode: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(PolicyLossInputs, cfg) -> (loss, metrics)`` as ``actor.policy_loss`` = ``name``.

    ``config``: a frozen dataclass of the loss's own knobs; the actor then builds ``cfg`` from its
    ``actor_rollout_ref.actor`` group with it (a field with a default may be absent from the YAML and set
    with ``+actor_rollout_ref.actor.<field>=...``). Without it ``cfg`` is the actor's loss section.
    ``auto_switch``: a boolean actor key that selects this loss under ``policy_loss=auto``
    (:func:`resolve_policy_loss`). ``metrics`` maps names to scalar tensors (logged as ``actor/<name>``;
    ``ppo_kl`` feeds ``use_ppo_kl_loss``).

    What the actor and the config checker need to know of the loss, declared here (the defaults suit a loss that
    knows nothing of them):

    - ``metric_tokens``: ``{"actor/<metric>": token set}`` for metrics not averaged over all response tokens, a
      set of :data:`~verl.utils.step_metrics.METRIC_TOKEN_SETS` (``actor.metric_aggregation=token_weighted``
      weights each micro-batch's value by that set's size); unlisted metrics use all response tokens.
    - ``supports_rollout_is``: the loss multiplies its per-token on-policy terms by
      ``inputs.rollout_is_weights`` (``algorithm.rollout_correction.rollout_is``); the actor refuses the weights
      for a loss without it rather than drop them.
    - ``supports_bypass_mode``: the loss reads the old log-probs only through the PPO ratio and its metrics, so
      ``algorithm.rollout_correction.bypass_mode`` may take the engine's log-probs (and, on tokens the engine did
      not sample, the current policy's) as the old ones; the checker refuses bypass mode for any other loss.
    """
    if config is not None and not is_dataclass(config):
        raise TypeError(f"register_policy_loss({name!r}, config=...) needs a dataclass, got {config!r}")
    unknown = {k: v for k, v in (metric_tokens or {}).items() if v not in METRIC_TOKEN_SETS}
    if unknown:
        raise ValueError(
            f"register_policy_loss({name!r}, metric_tokens=...): unknown token sets {unknown}; "
            f"valid: {list(METRIC_TOKEN_SETS)}"
        )
    register = _register(POLICY_LOSS_REGISTRY, "policy loss", name)

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        register(fn)
        if config is not None:
            POLICY_LOSS_CONFIGS[name] = config
        if auto_switch is not None:
            POLICY_LOSS_SWITCHES[name] = auto_switch
        if metric_tokens:
            LOSS_METRIC_TOKENS[name] = dict(metric_tokens)
        for table, supported in ((ROLLOUT_IS_LOSSES, supports_rollout_is), (BYPASS_LOSSES, supports_bypass_mode)):
            if supported:
                table.add(name)
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name``; ValueError listing the valid names otherwise."""
    return _lookup(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_config(name: str) -> Optional[type]:
    """The knob dataclass the loss ``name`` was registered with (None: it reads the actor's loss section)."""
    return POLICY_LOSS_CONFIGS.get(name)


def policy_loss_config(name: str, actor_cfg, loss_section):
    """The ``cfg`` the loss ``name`` is called with: its registered knob dataclass built from the
    ``actor_rollout_ref.actor`` group ``actor_cfg``, else the actor's ``loss_section``. An unknown name raises
    ValueError naming the registered ones."""
    from verl.utils.config_section import build_section

    get_policy_loss_fn(name)
    knobs = get_policy_loss_config(name)
    return loss_section if knobs is None else build_section(knobs, actor_cfg, "actor_rollout_ref.actor")


# ----------------------------------------------------------------------------------------------------
# Advantage estimators: each registered function returns verl's advantage; verl's functions (explicit arguments)
# are aliases of them.
# ----------------------------------------------------------------------------------------------------
def sequence_scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """Outcome score per sequence: ``s_i = Σ_t token_level_rewards[i, t]`` (shape ``[bs]``)."""
    return token_level_rewards.sum(dim=-1)


def group_normalized_scores(
    scores: torch.Tensor,
    index: Sequence[Any],
    epsilon: float,
    use_std: bool,
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
    seq_advantage: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast one value per row to its response tokens: ``A[i, t] = a_i·m[i, t]``; returns = A."""
    advantages = seq_advantage.unsqueeze(-1) * response_mask
    return advantages, advantages


def truncated_rows(responses: torch.Tensor, pad_token_id: int, eos_token_id, max_response_length: int) -> torch.Tensor:
    """``[rows]`` True where a response has ``>= max_response_length`` non-pad tokens and no EOS token
    (``eos_token_id``: an int or a list of ints)."""
    eos_ids = torch.tensor(
        [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), device=responses.device
    )
    response_length = (responses != pad_token_id).sum(dim=-1)
    return (response_length >= max_response_length) & ~torch.isin(responses, eos_ids).any(dim=-1)


@register_adv_est("grpo")
@torch.no_grad()
def grpo_advantage(inputs: AdvantageInputs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """``grpo`` (docs/METHOD.md §1.7): every row of the uid group is in the statistics.

    ``A_i = (s_i − μ_G)/(σ_G + ε)`` with unbiased σ, or ``s_i − μ_G`` when ``cfg.grpo_use_std`` is False
    (LUFFY: ``grpo_use_std=False``); a group of one row uses μ=0, σ=1; ``A[i, t] = A_i·m[i, t]``.
    """
    seq_adv = group_normalized_scores(
        sequence_scores(inputs.token_level_rewards), inputs.index, use_std=cfg.grpo_use_std, epsilon=cfg.epsilon
    )
    return broadcast_sequence_advantage(seq_adv, inputs.response_mask)


@register_adv_est("reinforce")
@torch.no_grad()
def reinforce_advantage(inputs: AdvantageInputs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """``reinforce``: the raw sequence score as advantage, no baseline: ``A[i, t] = s_i·m[i, t]``."""
    return broadcast_sequence_advantage(sequence_scores(inputs.token_level_rewards), inputs.response_mask)


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus_advantage(inputs: AdvantageInputs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """``reinforce_plus_plus``: discounted return ``G_t = r_t + γ·G_{t+1}`` (γ = ``cfg.gamma``, reset past the
    mask), whitened over all valid tokens of the batch: ``A = masked_whiten(G, m)·m``; returns = G."""
    rewards, mask = inputs.token_level_rewards, inputs.response_mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + cfg.gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    advantages = verl_F.masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est("gae")
@torch.no_grad()
def gae_advantage(inputs: AdvantageInputs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """``gae``: generalised advantage estimation on a critic's ``inputs.values`` (γ, λ = ``cfg.gamma``, ``cfg.lam``).

    ``δ_t = r_t + γ·V_{t+1} − V_t`` (V beyond the last column = 0), ``Â_t = δ_t + γλ·Â_{t+1}``,
    returns ``= Â + V``; advantages are then whitened over valid tokens. Both are multiplied by the mask.
    """
    rewards, values, mask = inputs.token_level_rewards, inputs.values, inputs.response_mask
    if values is None:
        raise ValueError("adv_estimator='gae' needs critic values; configure a critic or use grpo/reinforce")
    gamma, lam = cfg.gamma, cfg.lam
    next_advantage = torch.zeros_like(rewards[:, 0])
    reversed_advantages = []
    length = rewards.shape[1]
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t < length - 1 else torch.zeros_like(values[:, t])
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        reversed_advantages.append(next_advantage)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    returns = (advantages + values) * mask
    advantages = verl_F.masked_whiten(advantages, mask) * mask
    return advantages, returns


# verl's signatures (``eos_mask`` = the response mask), for users' scripts: each builds the inputs and the knobs
# and calls the registered estimator above.
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    eos_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = GRPO_EPSILON,
    use_std: bool = True,
):
    """verl's signature of :func:`grpo_advantage` -> ``(advantages, returns)``."""
    return grpo_advantage(
        AdvantageInputs(token_level_rewards, eos_mask, index), AdvantageConfig(grpo_use_std=use_std, epsilon=epsilon)
    )


def compute_reinforce_outcome_advantage(token_level_rewards: torch.Tensor, eos_mask: torch.Tensor):
    """verl's signature of :func:`reinforce_advantage` -> ``(advantages, returns)``."""
    return reinforce_advantage(AdvantageInputs(token_level_rewards, eos_mask, None), AdvantageConfig())


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, eos_mask: torch.Tensor, gamma: float = 1.0
):
    """verl's signature of :func:`reinforce_plus_plus_advantage` -> ``(advantages, returns)``."""
    return reinforce_plus_plus_advantage(
        AdvantageInputs(token_level_rewards, eos_mask, None), AdvantageConfig(gamma=gamma)
    )


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor | None,
    eos_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
):
    """verl's signature of :func:`gae_advantage` -> ``(advantages, returns)``."""
    return gae_advantage(
        AdvantageInputs(token_level_rewards, eos_mask, None, values=values), AdvantageConfig(gamma=gamma, lam=lam)
    )


# ----------------------------------------------------------------------------------------------------
# Policy loss and aggregation
# ----------------------------------------------------------------------------------------------------
def aggregate_token_loss(loss_mat: torch.Tensor, mask: torch.Tensor, loss_remove_token_mean: bool) -> torch.Tensor:
    """LUFFY's aggregation: ``Σ L·m / L_width`` (``L_width`` = response tensor width; verl's
    ``seq-mean-token-sum-norm``) when ``loss_remove_token_mean``, else the token mean ``Σ L·m / Σ m`` (0 for an
    empty mask, where verl's ``token-mean`` gives NaN)."""
    if loss_remove_token_mean:
        return (loss_mat * mask).sum() / mask.shape[-1]
    return verl_F.masked_mean_or_zero(loss_mat, mask)


AGG_LOSS_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Optional[int] = None,
    global_batch_size: Optional[int] = None,
    loss_scale_factor: Optional[int] = None,
) -> torch.Tensor:
    """verl's ``agg_loss``: the loss matrix ``[bs, L]`` to a scalar by ``loss_agg_mode`` (for users' losses).

    ``token-mean``: ``Σ L·m / N·dp`` (N = ``batch_num_tokens``, default Σ m); ``seq-mean-token-sum``: the mean
    over rows with a valid token of ``Σ_t L·m`` (``global_batch_size`` rows if given, times dp);
    ``seq-mean-token-mean``: the same mean of ``Σ_t L·m / (Σ_t m + 1e-8)``; ``seq-mean-token-sum-norm``:
    ``Σ L·m / loss_scale_factor`` (default the width L). This project's own losses use
    :func:`aggregate_token_loss` (LUFFY's two modes)."""
    if loss_agg_mode == "token-mean":
        tokens = loss_mask.sum() if batch_num_tokens is None else batch_num_tokens
        return verl_F.masked_sum(loss_mat, loss_mask) / tokens * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return (loss_mat * loss_mask).sum() / scale
    if loss_agg_mode not in AGG_LOSS_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {list(AGG_LOSS_MODES)}")
    row_sums = (loss_mat * loss_mask).sum(dim=-1)
    row_tokens = loss_mask.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        row_sums = row_sums / (row_tokens + 1e-8)
    rows_with_tokens = (row_tokens > 0).float()  # fully masked rows are left out of the mean
    rows = rows_with_tokens.sum() if global_batch_size is None else global_batch_size
    return verl_F.masked_sum(row_sums, rows_with_tokens) / rows * dp_size


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """verl's ``compute_entropy_loss``: the per-token entropy of ``logits`` ``[bs, L, V]`` aggregated by
    :func:`agg_loss`."""
    return agg_loss(verl_F.entropy_from_logits(logits), response_mask, loss_agg_mode)


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


@dataclass(frozen=True)
class PPOClipConfig:
    """The knobs of the ``vanilla`` loss outside a composed run (:func:`compute_policy_loss`); a run passes its
    actor's loss section, which has the same names."""

    clip_ratio: float
    loss_remove_token_mean: bool
    loss_remove_clip: bool


@register_policy_loss("vanilla", supports_rollout_is=True, supports_bypass_mode=True)
def ppo_clip_loss(inputs: PolicyLossInputs, cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate -> ``(pg_loss, {pg_clipfrac, ppo_kl})``.

    ``ρ = exp(ℓ − ℓ_old)``, ``L = max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε))`` (ε = ``cfg.clip_ratio``), or ``L = −A·ρ``
    with ``cfg.loss_remove_clip`` (clipfrac 0), times ``inputs.rollout_is_weights`` per token when given (rollout
    correction). Aggregated by :func:`aggregate_token_loss`. No
    ``clip_upper_bound``: LUFFY's plain PPO and SFT-multitask paths have none; only its off-policy token loss
    reads that key. ``pg_clipfrac`` = share of valid tokens where the clipped term is larger;
    ``ppo_kl = masked_mean(ℓ_old − ℓ)``.
    """
    mask = inputs.response_mask
    log_ratio = inputs.log_prob - inputs.old_log_prob
    ppo_kl = verl_F.masked_mean_or_zero(-log_ratio, mask)
    pg_losses, pg_clipfrac = clipped_pg_losses(
        inputs.advantages, torch.exp(log_ratio), mask, cfg.clip_ratio, remove_clip=cfg.loss_remove_clip
    )
    if inputs.rollout_is_weights is not None:  # rollout correction (verl: pg_losses * rollout_is_weights)
        pg_losses = pg_losses * inputs.rollout_is_weights
    pg_loss = aggregate_token_loss(pg_losses, mask, cfg.loss_remove_token_mean)
    return pg_loss, {"pg_clipfrac": pg_clipfrac, "ppo_kl": ppo_kl}


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    eos_mask: torch.Tensor,
    cliprange: float,
    loss_remove_token_mean: bool = False,
    loss_remove_clip: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's/LUFFY's signature of :func:`ppo_clip_loss` (``eos_mask`` = the response mask):
    ``(pg_loss, pg_clipfrac, ppo_kl)``."""
    pg_loss, metrics = ppo_clip_loss(
        PolicyLossInputs(log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=eos_mask),
        PPOClipConfig(
            clip_ratio=cliprange, loss_remove_token_mean=loss_remove_token_mean, loss_remove_clip=loss_remove_clip
        ),
    )
    return pg_loss, metrics["pg_clipfrac"], metrics["ppo_kl"]
