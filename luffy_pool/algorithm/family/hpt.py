"""HPT (arXiv 2509.04419, Hybrid Post-Training): per prompt, SFT on the demonstration when the group's
on-policy rollouts have at most ``switch_gate`` successes, RL on the rollouts otherwise.

Mirrors TsinghuaC3I/Unify-Post-Training (commit ae332f5f), ``hpt/verl/verl/mix_src/``:
``mix_trainer.py`` ``select_on_off_ada_balance`` -> :func:`hpt_switch_gate`; the ``offline_loss_type == "sft"``
branch of ``mix_actor.py`` ``update_policy`` (which combines ``mix_core_alg.compute_sft_pure_loss`` with
``verl/trainer/ppo/core_algos.compute_policy_loss``) -> :func:`hpt_sft_loss` (with :func:`sft_pure_loss`,
:func:`hpt_policy_loss`). METHODS_SPEC §3.

Quirks kept: the SFT term is the token mean of the demo rows in the micro-batch while the RL term is the
script's sum / width, so their balance depends on micro-batch packing; a micro-batch with no demo row has a
NaN SFT term, which is skipped; ``pg_clipfrac`` is computed after the clip has been applied (so it is 0
whenever the clip is on), as in their ``compute_policy_loss``; the gate returns their
``(on_remove_num, on_add_num, off_add_num)`` with the hard-coded ``on_remove_num = 8`` (removal is by mask in
their trainer). Fixed: an unknown ``unify_strategy`` (e.g. the YAML default ``balance``) raises instead of
returning None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from luffy_pool.algorithm.family.common import aggregate, masked_mean_plain
from luffy_pool.algorithm.family.registry import FamilyLossInputs, register

STRATEGIES = ("switch", "soft")


@dataclass(frozen=True)
class HptConfig:
    """HPT's knobs (``exp_scripts/train.sh`` for Qwen2.5-Math-7B: gate 0/0, coef 1.0, unclipped, sum/width)."""

    unify_strategy: str = "switch"
    switch_gate: int = 0
    switch_gate_off: int = 0
    n_verify: int = 8
    sft_loss_coef: float = 1.0
    clip_ratio: float = 0.2
    loss_remove_token_mean: bool = True
    loss_remove_clip: bool = True


@register("gate", "hpt_switch", config=HptConfig)
def hpt_switch_gate(success_count: int, cfg) -> tuple[int, int, int]:
    """``(on_remove_num, on_add_num, off_add_num)`` for a prompt whose verify rollouts have ``success_count``
    successes. ``switch``: ``c ≤ switch_gate`` -> (8, 0, 1) drop the rollouts, add one demo row (SFT);
    ``c ≤ switch_gate_off`` -> (8, 0, −1) a demo row for off-policy RL; else (0, 0, 0) keep the rollouts (RL).
    ``soft``: (0, 0, 1)."""
    if cfg.unify_strategy == "switch":
        if success_count <= cfg.switch_gate:
            return 8, 0, 1
        if success_count <= cfg.switch_gate_off:
            return 8, 0, -1
        return 0, 0, 0
    if cfg.unify_strategy == "soft":
        return 0, 0, 1
    raise ValueError(f"unknown hpt unify_strategy {cfg.unify_strategy!r}; valid: {list(STRATEGIES)}")


def sft_pure_loss(log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Σ(−ℓ)·m / Σm`` (NaN without a token), their ``compute_sft_pure_loss``."""
    return masked_mean_plain(-log_prob, mask)


def hpt_policy_loss(
    old_log_prob, log_prob, advantages, mask, clip_ratio: float, loss_remove_token_mean: bool, loss_remove_clip: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Their verl ``compute_policy_loss``: ``−A·ρ`` (PPO clip unless ``loss_remove_clip``), ``Σ/width`` or the
    token mean -> ``(pg_loss, pg_clipfrac, ppo_kl)``."""
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean_plain(-log_ratio, mask)
    losses = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    if not loss_remove_clip:
        losses = torch.max(losses, losses2)
    pg_loss = aggregate(losses, mask, loss_remove_token_mean)
    # their clipfrac compares against the already-clipped losses
    pg_clipfrac = masked_mean_plain(torch.gt(losses2, losses).float(), mask)
    return pg_loss, pg_clipfrac, ppo_kl


@register("loss", "hpt_sft", config=HptConfig)
def hpt_sft_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """HPT's micro-batch loss: demo rows (any ``prefix_mask`` token) -> ``sft_loss_coef · mean(−ℓ)``; the
    other rows -> :func:`hpt_policy_loss`; the SFT term is dropped when NaN (no demo row). The entropy bonus
    is the actor's, outside this function."""
    if inputs.prefix_mask is None:
        raise ValueError("the hpt_sft loss needs inputs.prefix_mask (the demonstration rows)")
    demo = inputs.prefix_mask.bool().any(-1)
    on = ~demo
    sft = sft_pure_loss(inputs.log_prob[demo], inputs.response_mask[demo])
    pg_loss, pg_clipfrac, ppo_kl = hpt_policy_loss(
        inputs.old_log_prob[on],
        inputs.log_prob[on],
        inputs.advantages[on],
        inputs.response_mask[on],
        cfg.clip_ratio,
        cfg.loss_remove_token_mean,
        cfg.loss_remove_clip,
    )
    loss = pg_loss if torch.isnan(sft) else sft * cfg.sft_loss_coef + pg_loss
    return loss, {
        "sft_loss": sft.detach(),
        "on_pg_loss": pg_loss.detach(),
        "pg_clipfrac": pg_clipfrac.detach(),
        "ppo_kl": ppo_kl.detach(),
    }
