"""LUFFY's module path ``verl.mix_src.mix_core_alg``: its mixed-policy functions under LUFFY's names and arguments,
as thin aliases of the registered ``fn(inputs, cfg)`` estimator and loss (``luffy_pool.algorithm.mix_core_alg``).

Each alias builds the inputs and the knobs and calls the registered function. Its knobs have no defaults of
their own: an argument left out (or None) takes the YAML's value (luffy_pool/config/mix_ppo_trainer.yaml, read
through ``LossSection``), so ``off_policy_reshape_weight`` is 0.1 here as in a run, not LUFFY's signature's 1.0.
"""

from __future__ import annotations

from typing import Optional

import torch

from luffy_pool.algorithm.mix_core_alg import (  # noqa: F401  (LUFFY's names; AdaptiveEntropyCoeff for its actor)
    AdaptiveEntropyCoeff,
    compute_sft_pure_loss,
    grpo_split_advantage,
    luffy_token_loss,
    sft_multitask_loss,
)
from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs, PolicyLossInputs, clamp_bound

__all__ = ["compute_grpo_outcome_advantage_split", "compute_sft_pure_loss", "compute_token_on_off_policy_loss"]

# LUFFY's keyword -> the actor key of the YAML the registered loss reads it as.
LUFFY_LOSS_ARGS = {
    "cliprange": "clip_ratio",
    "clip_upper_bound": "clip_upper_bound",
    "off_cliprange": "off_policy_cliprange",
    "off_max_clip": "off_policy_max_clip",
    "off_min_clip": "off_policy_min_clip",
    "all_max_clip": "all_max_clip",
    "off_policy_reshape": "off_policy_reshape",
    "off_policy_reshape_weight": "off_policy_reshape_weight",
    "off_policy_reshape_pow_exp": "off_policy_reshape_pow_exp",
    "on_policy_reshape": "on_policy_reshape",
    "on_policy_reshape_weight": "on_policy_reshape_weight",
    "on_policy_reshape_pow_exp": "on_policy_reshape_pow_exp",
    "loss_remove_token_mean": "loss_remove_token_mean",
    "loss_remove_clip": "loss_remove_clip",
    "sft_loss_coef": "sft_loss_coef",
}


def luffy_loss_section(**luffy_args):
    """The actor's ``LossSection`` of the YAML with LUFFY's keyword arguments set (None = the YAML's value)."""
    from luffy_pool.config.compose import actor_config
    from luffy_pool.config.sections import LossSection

    values = {LUFFY_LOSS_ARGS[name]: value for name, value in luffy_args.items() if value is not None}
    return LossSection.from_actor_config(actor_config(**values))


@torch.no_grad()
def compute_grpo_outcome_advantage_split(
    token_level_rewards: torch.Tensor,
    eos_mask: torch.Tensor,
    index,
    on_policy_mask: torch.Tensor,
    epsilon: float = 1e-6,
    use_std: bool = True,
):
    """LUFFY's signature of the ``grpo_split`` estimator -> ``(advantages, returns)`` (``eos_mask`` = the response
    mask; ``epsilon`` and ``use_std`` default as LUFFY's and the YAML's ``grpo_use_std``)."""
    return grpo_split_advantage(
        AdvantageInputs(token_level_rewards, eos_mask, index, on_policy_mask=on_policy_mask),
        AdvantageConfig(grpo_use_std=use_std, epsilon=epsilon),
    )


def compute_token_on_off_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    eos_mask: torch.Tensor,
    cliprange: Optional[float],
    clip_upper_bound: Optional[float],
    prefix_mask: torch.Tensor,
    off_cliprange: Optional[float] = None,
    off_normalize: bool = False,
    off_abs_cliprange: Optional[float] = None,
    off_max_clip: Optional[float] = None,
    off_min_clip: Optional[float] = None,
    all_max_clip: Optional[float] = None,
    off_policy_reshape: Optional[str] = None,
    off_policy_reshape_weight: Optional[float] = None,
    off_policy_reshape_pow_exp: Optional[float] = None,
    on_policy_reshape: Optional[str] = None,
    on_policy_reshape_weight: Optional[float] = None,
    on_policy_reshape_pow_exp: Optional[float] = None,
    target_probs: Optional[torch.Tensor] = None,
    loss_remove_token_mean: Optional[bool] = None,
    loss_remove_clip: Optional[bool] = None,
) -> dict[str, torch.Tensor]:
    """LUFFY's signature of the ``luffy_token`` loss -> LUFFY's dict: ``pg_loss``, the loss's metrics and
    ``off_pg_clipfrac`` (always 0: the token loss never clips off-policy tokens; kept because LUFFY returns it).

    ``eos_mask`` is the response mask; ``target_probs`` the behaviour *probabilities*, passed as their log (NaN,
    or a negative padding value, = unknown: the configured shaping). ``off_max_clip`` / ``off_min_clip`` /
    ``all_max_clip``: -1 = off. ``off_cliprange`` is accepted and unused, as in LUFFY; ``off_normalize`` and
    ``off_abs_cliprange`` belong to LUFFY's unwired sequence-level loss and are rejected.
    """
    if off_normalize:
        raise ValueError(
            "off_policy_normalize=True is only meaningful for LUFFY's sequence-level loss, "
            "which is not implemented; the token loss (off_policy_loss_impl=token) needs False"
        )
    if clamp_bound(off_abs_cliprange) is not None:
        raise ValueError("off_abs_cliprange is not supported by the token-level on/off-policy loss")
    cfg = luffy_loss_section(
        cliprange=cliprange,
        clip_upper_bound=clip_upper_bound,
        off_cliprange=off_cliprange,
        off_max_clip=off_max_clip,
        off_min_clip=off_min_clip,
        all_max_clip=all_max_clip,
        off_policy_reshape=off_policy_reshape,
        off_policy_reshape_weight=off_policy_reshape_weight,
        off_policy_reshape_pow_exp=off_policy_reshape_pow_exp,
        on_policy_reshape=on_policy_reshape,
        on_policy_reshape_weight=on_policy_reshape_weight,
        on_policy_reshape_pow_exp=on_policy_reshape_pow_exp,
        loss_remove_token_mean=loss_remove_token_mean,
        loss_remove_clip=loss_remove_clip,
    )
    inputs = PolicyLossInputs(
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=eos_mask,
        prefix_mask=prefix_mask,
        behaviour_log_probs=None if target_probs is None else target_probs.log(),
    )
    pg_loss, metrics = luffy_token_loss(inputs, cfg)
    out = {
        "pg_loss": pg_loss,
        "off_pg_loss": metrics.pop("off_pg_loss"),
        "on_pg_loss": metrics.pop("on_pg_loss"),
        "off_pg_clipfrac": torch.zeros((), device=log_prob.device),
    }
    out.update(metrics)
    return out


def compute_sft_multitask_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    eos_mask: torch.Tensor,
    prefix_mask: torch.Tensor,
    cliprange: Optional[float] = None,
    sft_loss_coef: Optional[float] = None,
    loss_remove_token_mean: Optional[bool] = None,
    loss_remove_clip: Optional[bool] = None,
) -> dict[str, torch.Tensor]:
    """The keyword form of the ``sft_multitask`` loss (importable here before the one dispatch) -> ``{pg_loss,
    sft_loss, on_pg_loss, pg_clipfrac, ppo_kl}``; an argument left out takes the YAML's value."""
    cfg = luffy_loss_section(
        cliprange=cliprange,
        sft_loss_coef=sft_loss_coef,
        loss_remove_token_mean=loss_remove_token_mean,
        loss_remove_clip=loss_remove_clip,
    )
    inputs = PolicyLossInputs(
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=eos_mask,
        prefix_mask=prefix_mask,
    )
    pg_loss, metrics = sft_multitask_loss(inputs, cfg)
    return {"pg_loss": pg_loss, **metrics}
