"""The one call shape of policy losses and advantage estimators, and the knob tables of registered losses.

A registered policy loss is ``fn(inputs: PolicyLossInputs, cfg) -> (loss, metrics)`` and an estimator
``fn(inputs: AdvantageInputs, cfg) -> (advantages, returns)``. ``cfg`` is a config section read by
attribute, so a misspelt knob raises AttributeError instead of silently keeping a default: for a loss the
section its registration declares (``register_policy_loss(name, config=<frozen dataclass>)``, built from
the ``actor_rollout_ref.actor`` group) or the actor's loss section; for an estimator the ``algorithm``
section's knobs (``gamma``, ``lam``, ``grpo_use_std``: :class:`AdvantageConfig`). This module holds no torch code,
so the config checker can ask which keys the registered losses declare (:func:`registered_loss_keys`), which loss
``policy_loss=auto`` selects (:func:`resolve_policy_loss`) and which losses take rollout correction's weights or
bypass mode (:data:`ROLLOUT_IS_LOSSES`, :data:`BYPASS_LOSSES`) without importing torch. The tables are filled by
``register_policy_loss`` (verl/trainer/ppo/core_algos.py): each loss declares itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

# loss name -> the frozen dataclass of its own knobs (only losses registered with ``config=``).
POLICY_LOSS_CONFIGS: dict[str, type] = {}
# loss name -> the boolean actor key that selects it under ``policy_loss=auto`` (only losses registered with
# ``auto_switch=``).
POLICY_LOSS_SWITCHES: dict[str, str] = {}
GRPO_EPSILON = 1e-6  # the ε of (s − μ)/(σ + ε), verl's and LUFFY's
AUTO_FALLBACK_LOSS = "vanilla"  # what ``auto`` selects when no switch is on: verl's PPO clip loss
# Losses that multiply their on-policy token terms by ``PolicyLossInputs.rollout_is_weights`` (rollout correction,
# algorithm.rollout_correction.rollout_is; registered with ``supports_rollout_is=True``); the actor refuses the
# weights for any other loss rather than drop them.
ROLLOUT_IS_LOSSES: set[str] = set()
# Losses that read the old log-probs only through the PPO ratio and its metrics (registered with
# ``supports_bypass_mode=True``): algorithm.rollout_correction.bypass_mode is refused for any other loss.
BYPASS_LOSSES: set[str] = set()


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
    (uid) of each row; ``on_policy_mask`` ``[rows]`` is True for rows the policy sampled whole (no off-policy
    token; an estimator may take its group statistics from those rows only); ``values`` are a critic's values
    (None without a critic).
    """

    token_level_rewards: Any
    response_mask: Any
    index: Any
    on_policy_mask: Optional[Any] = None
    values: Optional[Any] = None


@dataclass(frozen=True)
class AdvantageConfig:
    """What a registered estimator reads: the ``algorithm`` knobs (defaults = verl's ``compute_*`` arguments,
    equal to the YAML's) and the ε of ``(s − μ)/(σ + ε)``."""

    gamma: float = 1.0
    lam: float = 1.0
    grpo_use_std: bool = True
    epsilon: float = GRPO_EPSILON


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
