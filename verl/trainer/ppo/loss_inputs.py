"""The one call shape of policy losses and advantage estimators, and the knob tables of registered losses.

A registered policy loss is ``fn(inputs: PolicyLossInputs, cfg) -> (loss, metrics)`` and an estimator
``fn(inputs: AdvantageInputs, cfg) -> (advantages, returns)``. ``cfg`` is a config section read by
attribute, so a misspelt knob raises AttributeError instead of silently keeping a default: for a loss the
section its registration declares (``register_policy_loss(name, config=<frozen dataclass>)``, built from
the ``actor_rollout_ref.actor`` group) or the actor's loss section; for an estimator the ``algorithm``
section (``gamma``, ``lam``, ``grpo_use_std``) with LUFFY's post-processing (:class:`AdvantageConfig`). This module
holds no torch code, so the config checker can ask which keys the registered losses declare
(:func:`registered_loss_keys`) and which loss ``policy_loss=auto`` selects (:func:`resolve_policy_loss`) without
importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

# loss name -> the frozen dataclass of its own knobs (only losses registered with ``config=``).
POLICY_LOSS_CONFIGS: dict[str, type] = {}
# loss name -> the boolean actor key that selects it under ``policy_loss=auto`` (only losses registered with
# ``auto_switch=``: LUFFY's use_off_policy_loss -> luffy_token, use_sft_multitask_loss -> sft_multitask).
POLICY_LOSS_SWITCHES: dict[str, str] = {}
GRPO_EPSILON = 1e-6  # the ε of (s − μ)/(σ + ε), verl's and LUFFY's
AUTO_FALLBACK_LOSS = "vanilla"  # what ``auto`` selects when no switch is on: verl's PPO clip loss
# Losses that multiply their on-policy token terms by ``PolicyLossInputs.rollout_is_weights`` (rollout correction,
# algorithm.rollout_correction.rollout_is); the actor refuses the weights for any other loss rather than drop them.
ROLLOUT_IS_LOSSES: set[str] = {"vanilla", "luffy_token", "sft_multitask"}


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch's tensors for a policy loss, each ``[rows, response_length]``.

    ``response_mask`` marks valid response tokens; ``prefix_mask`` the off-policy (prefix) tokens;
    ``behaviour_log_probs`` the log-probs of the policy that wrote the off-policy tokens (NaN = unknown),
    present only with ``actor.use_off_policy_probs``; ``rollout_is_weights`` the truncated importance weights
    pi_old / pi_rollout of rollout correction (1 on off-policy tokens), present only with
    ``algorithm.rollout_correction.rollout_is`` (losses in :data:`ROLLOUT_IS_LOSSES` multiply their per-token
    on-policy terms by them before aggregation, as verl). A loss that needs an absent tensor says so.
    """

    log_prob: Any
    old_log_prob: Any
    advantages: Any
    response_mask: Any
    prefix_mask: Optional[Any] = None
    behaviour_log_probs: Optional[Any] = None
    rollout_is_weights: Optional[Any] = None


@dataclass(frozen=True)
class AdvantageInputs:
    """The merged batch's tensors for an advantage estimator.

    ``token_level_rewards`` and ``response_mask`` are ``[rows, response_length]``; ``index`` holds the group
    (uid) of each row; ``on_policy_mask`` ``[rows]`` is True for rows without prefix tokens; ``values`` are
    a critic's values (None without a critic). LUFFY's post-processing (:class:`MixedAdvantageConfig`) also
    reads ``prefix_mask`` ``[rows, response_length]`` (the off-policy tokens) and, for truncated rows,
    ``responses`` with the tokenizer's ``pad_token_id`` / ``eos_token_id`` (an int or a list of ints).
    """

    token_level_rewards: Any
    response_mask: Any
    index: Any
    on_policy_mask: Optional[Any] = None
    values: Optional[Any] = None
    prefix_mask: Optional[Any] = None
    responses: Optional[Any] = None
    pad_token_id: Optional[int] = None
    eos_token_id: Optional[Any] = None


@dataclass(frozen=True)
class MixedAdvantageConfig:
    """LUFFY's post-processing of the group advantage, applied in this order by every registered estimator
    (docs/METHOD.md §1.7): ``A ← A·(α·P + β·¬P)`` (``rollout.prefix_reward_weight_alpha/beta``, P = prefix
    token), ``A = 0`` on truncated rows (``data.disable_truncation_advantage``), ``A = sft_prefix_advantage`` on
    prefix tokens (``actor.sft_prefix_reward_weight / rollout.n`` with ``actor.use_sft_prefix_reward``, else
    None), then ``A·m``. Built from the run's sections by ``luffy_pool.algorithm.mix_advantage``."""

    prefix_reward_weight_alpha: float
    prefix_reward_weight_beta: float
    disable_truncation_advantage: bool
    sft_prefix_advantage: Optional[float]


@dataclass(frozen=True)
class AdvantageConfig:
    """What a registered estimator reads: the ``algorithm`` knobs (defaults = verl's ``compute_*`` arguments,
    equal to the YAML's), the ε of ``(s − μ)/(σ + ε)``, and LUFFY's post-processing (``mixed``; None = the
    estimator's advantage as verl returns it)."""

    gamma: float = 1.0
    lam: float = 1.0
    grpo_use_std: bool = True
    epsilon: float = GRPO_EPSILON
    mixed: Optional[MixedAdvantageConfig] = None


def clamp_bound(value: Optional[float]) -> Optional[float]:
    """A clamp bound as a loss uses it: LUFFY's configs write -1 for "no clamp"; None means the same."""
    return None if value is None or value == -1 else value


def resolve_policy_loss(loss_cfg) -> str:
    """The loss ``actor.policy_loss`` names, or with ``auto`` the one whose ``auto_switch`` key is True on
    ``loss_cfg`` (a section without that key has it off), else ``vanilla``. Two switches on raise ValueError."""
    name = loss_cfg.policy_loss or "auto"
    if name != "auto":
        return str(name)
    chosen = [loss for loss, switch in POLICY_LOSS_SWITCHES.items() if getattr(loss_cfg, switch, False)]
    if len(chosen) > 1:
        keys = " and ".join(f"actor.{POLICY_LOSS_SWITCHES[loss]}" for loss in chosen)
        raise ValueError(f"{keys} cannot both be True (policy_loss=auto selects one loss)")
    return chosen[0] if chosen else AUTO_FALLBACK_LOSS


def registered_loss_keys() -> set[str]:
    """Actor keys declared by the config dataclasses of registered losses (a ``+actor_rollout_ref.actor.<key>``
    override of one of them is a known key)."""
    return {f.name for cls in POLICY_LOSS_CONFIGS.values() for f in fields(cls)}
