"""KL between the policy and the reference model: per-token estimators, coefficient controllers, and
the KL-in-reward penalty the driver applies before computing advantages (docs/METHOD.md §1.6).

The same per-token estimators serve the actor's optional KL loss (docs/METHOD.md §1.9, ``kl_loss_type``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.utils import torch_functional as verl_F

__all__ = [
    "KL_PENALTY_TYPES",
    "KL_PENALTY_ALIASES",
    "kl_penalty",
    "FixedKLController",
    "AdaptiveKLController",
    "get_kl_controller",
    "apply_kl_penalty",
]

KL_PENALTY_TYPES = ("kl", "abs", "mse", "low_var_kl")
# verl >= 0.4's names for the same estimators (Schulman's k1/k2/k3), accepted by kl_penalty() for users' scripts;
# the YAML keys (kl_loss_type, algorithm.kl_penalty) take the names above.
KL_PENALTY_ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
KL_CONTROLLER_TYPES = ("fixed", "adaptive")  # algorithm.kl_ctrl.type


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "kl") -> torch.Tensor:
    """Per-token KL estimate between the policy (``logprob``) and the reference (``ref_logprob``).

    With ``d = logprob − ref_logprob``:
    ``kl`` (``k1``): d; ``abs``: |d|; ``mse`` (``k2``): d²/2; ``low_var_kl`` (``k3``, Schulman's k3):
    ``clamp(exp(−d) + d − 1, −10, 10)``. ``full`` needs full-vocabulary distributions and is rejected.
    """
    kl_penalty = KL_PENALTY_ALIASES.get(kl_penalty, kl_penalty)
    diff = logprob - ref_logprob
    if kl_penalty == "kl":
        return diff
    if kl_penalty == "abs":
        return diff.abs()
    if kl_penalty == "mse":
        return 0.5 * diff.square()
    if kl_penalty == "low_var_kl":
        k3 = torch.exp(-diff) + diff - 1
        return torch.clamp(k3, min=-10, max=10)
    if kl_penalty == "full":
        raise ValueError(
            "kl_penalty='full' needs full-vocabulary log-probs, which the rollout does not keep; "
            f"use one of {list(KL_PENALTY_TYPES)}"
        )
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}; valid: {list(KL_PENALTY_TYPES) + list(KL_PENALTY_ALIASES)}")


class FixedKLController:
    """Constant KL coefficient β."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient never changes."""


class AdaptiveKLController:
    """Adaptive β (Ziegler et al., 2019): ``β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·n_steps/horizon)``."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if horizon <= 0:
            raise ValueError(f"AdaptiveKLController: horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β towards the KL target; ``n_steps`` = number of sequences the KL was measured on."""
        proportional_error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + proportional_error * n_steps / self.horizon


def _cfg(config: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a dict, DictConfig or attribute object."""
    if hasattr(config, "get"):
        return config.get(key, default)
    return getattr(config, key, default)


def get_kl_controller(kl_ctrl_config: Any) -> FixedKLController | AdaptiveKLController:
    """Build the controller named by ``kl_ctrl.type`` (``fixed`` | ``adaptive``) from ``algorithm.kl_ctrl``."""
    ctrl_type = _cfg(kl_ctrl_config, "type", "fixed")
    kl_coef = _cfg(kl_ctrl_config, "kl_coef", 0.001)
    if ctrl_type == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if ctrl_type == "adaptive":
        target_kl = _cfg(kl_ctrl_config, "target_kl")
        horizon = _cfg(kl_ctrl_config, "horizon")
        if target_kl is None or horizon is None:
            raise ValueError("algorithm.kl_ctrl.type=adaptive needs kl_ctrl.target_kl and kl_ctrl.horizon")
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {ctrl_type!r}; valid: {list(KL_CONTROLLER_TYPES)}")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor | None,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-in-reward: ``rewards = scores − β·KL(old, ref)·mask`` (docs/METHOD.md §1.6).

    Without a reference policy β = 0 and ``rewards = scores``. ``critic/kl`` is the batch mean of
    the per-sequence token-mean KL; ``critic/kl_coeff`` the β used. The controller is updated with
    that KL (and the number of sequences) only when a reference exists.
    """
    if ref_log_prob is None:
        return token_level_scores, {"critic/kl": 0.0, "critic/kl_coeff": 0.0}
    beta = kl_ctrl.value
    kld = kl_penalty_fn(old_log_prob, ref_log_prob, kl_penalty) * response_mask
    token_level_rewards = token_level_scores - beta * kld
    current_kl = verl_F.masked_mean_or_zero(kld, response_mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"critic/kl": current_kl, "critic/kl_coeff": beta}


# ``apply_kl_penalty`` has a parameter named like the function (LUFFY's keyword); keep an alias.
kl_penalty_fn = kl_penalty
