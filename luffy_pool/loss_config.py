"""Which registered policy loss a run uses, and what the actor config gives it.

Every policy loss in ``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY`` has one signature: keyword
arguments named from ``LOSS_TENSORS`` (this micro-batch's tensors) and from ``policy_loss_kwargs`` (the
config's values), taking only those it declares (``call_with_supported_kwargs``), and it returns a dict
with ``pg_loss`` plus metric tensors (``ppo_kl`` among them for ``use_ppo_kl_loss``). Adding a loss is one
function with ``@register_policy_loss("name")`` and ``actor.policy_loss=name``.
"""
from __future__ import annotations

from typing import Any

from luffy_pool.config_sections import LossSection

# Per-micro-batch inputs the actor offers every loss. Log-probs are per response token ([rows, L]); eos_mask
# is the response mask; target_probs are the behaviour probabilities of prefix tokens (use_off_policy_probs),
# LUFFY's loss contract: the batch carries behaviour *log*-probs (NaN = unknown) from the dataset to here, and
# loss_tensors converts them once to probabilities; unknown stays NaN and the loss gives those tokens the
# configured shaping f(p) instead of p / pi_b (LUFFY's -1 padding gave the weight -p and a 0 gave p / 1e-6;
# the per-step metric batch/behaviour_prob_unknown_rows counts the rows this touches).
LOSS_TENSORS = ("old_log_prob", "log_prob", "advantages", "eos_mask", "prefix_mask", "target_probs")


def policy_loss_name(actor_cfg) -> str:
    """``actor.policy_loss``, or with ``auto`` the loss LUFFY's switches select: ``luffy_token``
    (use_off_policy_loss), ``sft_multitask`` (use_sft_multitask_loss), else ``vanilla`` (PPO clip)."""
    loss = LossSection.from_actor_config(actor_cfg)
    name = loss.policy_loss or "auto"
    if name != "auto":
        return str(name)
    if loss.use_off_policy_loss:
        return "luffy_token"
    if loss.use_sft_multitask_loss:
        return "sft_multitask"
    return "vanilla"


def _off(value):
    """LUFFY's -1 = 'no clamp'; the loss functions take None."""
    return None if value is None or value == -1 else value


def policy_loss_kwargs(actor_cfg) -> dict[str, Any]:
    """The config-to-loss mapping: loss keyword -> value, for every actor key a loss may read."""
    c = LossSection.from_actor_config(actor_cfg)
    return {
        "cliprange": c.clip_ratio,
        "clip_upper_bound": c.clip_upper_bound,
        "loss_remove_token_mean": c.loss_remove_token_mean,
        "loss_remove_clip": c.loss_remove_clip,
        "off_cliprange": c.off_policy_cliprange,
        "off_normalize": c.off_policy_normalize,
        "off_max_clip": _off(c.off_policy_max_clip),
        "off_min_clip": _off(c.off_policy_min_clip),
        "all_max_clip": _off(c.all_max_clip),
        "off_policy_reshape": c.off_policy_reshape,
        "off_policy_reshape_weight": c.off_policy_reshape_weight,
        "off_policy_reshape_pow_exp": c.off_policy_reshape_pow_exp,
        "on_policy_reshape": c.on_policy_reshape,
        "on_policy_reshape_weight": c.on_policy_reshape_weight,
        "on_policy_reshape_pow_exp": c.on_policy_reshape_pow_exp,
        "sft_loss_coef": c.sft_loss_coef,
    }


def loss_tensors(micro: dict, log_prob, response_mask, use_off_policy_probs: bool) -> dict[str, Any]:
    """The ``LOSS_TENSORS`` of one micro-batch (None where the batch has no such tensor)."""
    return {
        "old_log_prob": micro.get("old_log_probs"),
        "log_prob": log_prob,
        "advantages": micro.get("advantages"),
        "eos_mask": response_mask,
        "prefix_mask": micro.get("prefix_mask"),
        "target_probs": behaviour_probs(micro.get("behaviour_log_probs"), log_prob.dtype) if use_off_policy_probs
        else None,
    }


def behaviour_probs(behaviour_log_probs, dtype):
    """exp of the behaviour log-probs; NaN (unknown) stays NaN, so the loss gives those tokens the configured
    shaping f(p) instead of an importance weight (``compute_token_on_off_policy_loss``); None stays None."""
    if behaviour_log_probs is None:
        return None
    return behaviour_log_probs.exp().to(dtype)
