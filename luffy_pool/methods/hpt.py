"""``algorithm.method=hpt`` (arXiv 2509.04419, Hybrid Post-Training): per prompt, SFT on the demonstration when
the group's on-policy rollouts have at most ``algorithm.hpt.switch_gate`` successes, RL on the rollouts otherwise;
its pure blocks first, then the method's wiring.

Blocks: mirror TsinghuaC3I/Unify-Post-Training (commit ae332f5f), ``hpt/verl/verl/mix_src/``: ``mix_trainer.py``
``select_on_off_ada_balance`` -> :func:`hpt_switch_gate`; the ``offline_loss_type == "sft"`` branch of
``mix_actor.py`` ``update_policy`` (``mix_core_alg.compute_sft_pure_loss`` with
``verl/trainer/ppo/core_algos.compute_policy_loss``) -> :func:`hpt_sft_loss` (with :func:`sft_pure_loss`,
:func:`hpt_policy_loss`). Quirks kept: the SFT term is the token mean of the demo rows in the micro-batch while
the RL term is the script's sum / width, so their balance depends on micro-batch packing; a micro-batch with no
demo row has a NaN SFT term, which is skipped; ``pg_clipfrac`` is computed after the clip has been applied (so it
is 0 whenever the clip is on), as in their ``compute_policy_loss``; the gate returns their
``(on_remove_num, on_add_num, off_add_num)`` with the hard-coded ``on_remove_num = 8`` (removal is by mask in
their trainer). Fixed: an unknown ``unify_strategy`` (e.g. the YAML default ``balance``) raises instead of
returning None.

Wiring: LUFFY's slot plan (``n − 1`` on-policy rollouts + one full demonstration row per group), so the verify
rollouts are the group's ``n − 1`` on-policy rows (the authors roll out ``n_verify = 8`` and then add the demo row:
``rollout.n = 9`` is their plan; exp_scripts/train_hpt.sh keeps n = 8, 7 verify rollouts). The gate
(:func:`hpt_gate` over :func:`hpt_switch_gate`) runs on the driver after the advantage and writes
``loss_row_mask``: 1 on the rows the authors keep (the demo row of a switched group; the rollouts otherwise), 0 on
the rows they drop; the ``hpt_sft`` loss masks the dropped rows out, which equals removing them (its RL term is a
sum / L, its SFT term a mean over the kept demo tokens). The advantage is ``grpo_split`` (over the on-policy rows
only, as the authors' over the 8 kept rollouts). Differences kept visible: the entropy bonus still averages over
every row of the micro-batch; the authors pad batches to a multiple of 8, we keep every group's n rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from luffy_pool.methods.loss_helpers import aggregate, masked_mean_plain
from luffy_pool.methods.loss_inputs import FamilyLossInputs
from verl.utils.config_section import NON_NEGATIVE, key

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


@dataclass(frozen=True)
class HptKnobs:
    """``algorithm.hpt``: HPT's gate."""

    switch_gate: int = key(
        bounds=NON_NEGATIVE,
        default=0,
        doc="A group whose on-policy rollouts have at most this many successes trains on its demonstration (SFT); otherwise on its rollouts (RL). Authors: 0 (Qwen2.5-Math-7B), 2 (Llama-3.1-8B).",
    )


def hpt_loss(inputs: FamilyLossInputs, knobs: HptKnobs, step: int):
    """:func:`hpt_sft_loss` with the actor's loss keys (its SFT coefficient, clip and aggregation)."""
    loss = inputs.settings
    cfg = HptConfig(
        switch_gate=knobs.switch_gate,
        switch_gate_off=knobs.switch_gate,
        sft_loss_coef=loss.sft_loss_coef,
        clip_ratio=loss.clip_ratio,
        loss_remove_token_mean=loss.loss_remove_token_mean,
        loss_remove_clip=loss.loss_remove_clip,
    )
    return hpt_sft_loss(inputs, cfg)


def hpt_gate(batch, sections) -> dict:
    """Per group (uid): ``c`` = successes among its on-policy rows; the family gate decides SFT (keep the demo
    row) or RL (keep the rollouts). Sets ``batch.batch["loss_row_mask"]``; metrics ``hpt/sft_group_fraction``
    and ``hpt/mean_successes``."""
    from deepscaler.rewards import fail_success_values

    knobs = sections.knobs
    cfg = HptConfig(switch_gate=knobs.switch_gate, switch_gate_off=knobs.switch_gate)
    _, success = fail_success_values(int(sections.data.reward_impl_version))
    scores = batch.batch["token_level_scores"].sum(-1)
    demo = batch.batch["prefix_mask"].bool().any(-1)
    uids = np.asarray(batch.non_tensor_batch["uid"])
    keep = torch.zeros(len(uids), dtype=torch.float32)
    switched, counts = 0, []
    for uid in dict.fromkeys(uids.tolist()):
        rows = torch.as_tensor(uids == uid)
        c = int(((scores == success) & rows & ~demo).sum())
        on_remove, _, _ = hpt_switch_gate(c, cfg)
        keep[rows & (demo if on_remove else ~demo)] = 1.0
        switched += bool(on_remove)
        counts.append(c)
    batch.batch["loss_row_mask"] = keep
    return {"hpt/sft_group_fraction": switched / max(len(counts), 1), "hpt/mean_successes": float(np.mean(counts))}


class HptHooks(StepHooks):
    """The gate, after the advantage and before the update."""

    name = "hpt"

    def __init__(self, context):
        self.sections = context.sections

    def before_update(self, batch):
        return hpt_gate(batch, self.sections), {}


HPT = register_method(
    Method(
        name="hpt",
        mechanism="per group: SFT on the demonstration if its rollouts have <= switch_gate successes, else RL",
        knobs=HptKnobs,
        loss=hpt_loss,
        hooks=HptHooks,
        needs_demonstration=True,
        batch_keys=("loss_row_mask",),
    )
)
