"""The one call shape of policy losses and advantage estimators, and the knob tables of registered losses.

A registered policy loss is ``fn(inputs: PolicyLossInputs, cfg) -> (loss, metrics)`` and an estimator
``fn(inputs: AdvantageInputs, cfg) -> (advantages, returns)``. ``cfg`` is a config section read by
attribute, so a misspelt knob raises AttributeError instead of silently keeping a default: for a loss the
section its registration declares (``register_policy_loss(name, config=<frozen dataclass>)``, built from
the ``actor_rollout_ref.actor`` group) or the actor's loss section; for an estimator the ``algorithm``
section (``gamma``, ``lam``, ``grpo_use_std``). This module holds no torch code, so the config checker can
ask which keys the registered losses declare (:func:`registered_loss_keys`) without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

# loss name -> the frozen dataclass of its own knobs (only losses registered with ``config=``).
POLICY_LOSS_CONFIGS: dict[str, type] = {}


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch's tensors for a policy loss, each ``[rows, response_length]``.

    ``response_mask`` marks valid response tokens; ``prefix_mask`` the off-policy (prefix) tokens;
    ``behaviour_log_probs`` the log-probs of the policy that wrote the off-policy tokens (NaN = unknown),
    present only with ``actor.use_off_policy_probs``. A loss that needs an absent tensor says so.
    """

    log_prob: Any
    old_log_prob: Any
    advantages: Any
    response_mask: Any
    prefix_mask: Optional[Any] = None
    behaviour_log_probs: Optional[Any] = None


@dataclass(frozen=True)
class AdvantageInputs:
    """The merged batch's tensors for an advantage estimator.

    ``token_level_rewards`` and ``response_mask`` are ``[rows, response_length]``; ``index`` holds the group
    (uid) of each row; ``on_policy_mask`` ``[rows]`` is True for rows without prefix tokens; ``values`` are
    a critic's values (None without a critic).
    """

    token_level_rewards: Any
    response_mask: Any
    index: Any
    on_policy_mask: Optional[Any] = None
    values: Optional[Any] = None


@dataclass(frozen=True)
class AdvantageConfig:
    """The estimator knobs outside a composed run (verl's and LUFFY's ``compute_advantage(...)`` arguments);
    a run passes its ``algorithm`` section, which has the same names."""

    gamma: float = 1.0
    lam: float = 1.0
    grpo_use_std: bool = True


def clamp_bound(value: Optional[float]) -> Optional[float]:
    """A clamp bound as a loss uses it: LUFFY's configs write -1 for "no clamp"; None means the same."""
    return None if value is None or value == -1 else value


def registered_loss_keys() -> set[str]:
    """Actor keys declared by the config dataclasses of registered losses (a ``+actor_rollout_ref.actor.<key>``
    override of one of them is a known key)."""
    return {f.name for cls in POLICY_LOSS_CONFIGS.values() for f in fields(cls)}
