"""The family's losses in the actor's one dispatch: ``hpt_sft``, ``srft``, ``chord``, ``prefix_rft``, ``uft`` and
``exgrpo`` registered in
``POLICY_LOSS_REGISTRY``, and how the LUFFY actor calls them (:func:`family_policy_loss`).

Their knobs live in the method's YAML group ``algorithm.<method>`` (the driver's config, not the actor group the
workers are built from), and CHORD's μ needs the step. So the trainer sends both with every update
(``meta_info["method"]``, :func:`update_meta`), and the actor builds the loss's knob dataclass from them and its own
loss keys (clip, aggregation, shaping) per update. They are registered without ``config=`` for that reason: a
knob dataclass there is read from the actor group and would add ``+actor_rollout_ref.actor.*`` keys.
The family functions (luffy_pool/algorithm/family/) receive :class:`FamilyLossInputs`: token entropies, expert
rows (those with prefix tokens), correct rows (``row_scores == 1``) and the step; rows a gate dropped
(``loss_row_mask == 0``) get an all-zero response mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from luffy_pool.algorithm.family.chord import ChordConfig, chord_mixed_loss
from luffy_pool.algorithm.family.exgrpo import ExgrpoLossConfig, exgrpo_token_loss
from luffy_pool.algorithm.family.hpt import HptConfig, hpt_sft_loss
from luffy_pool.algorithm.family.prefix_rft import PrefixRftConfig, prefix_rft_loss
from luffy_pool.algorithm.family.registry import FamilyLossInputs
from luffy_pool.algorithm.family.srft import SrftConfig, srft_loss
from luffy_pool.algorithm.family.uft import UftLossConfig, uft_loss
from verl.trainer.ppo.core_algos import register_policy_loss

for _name, _fn in (
    ("hpt_sft", hpt_sft_loss),
    ("srft", srft_loss),
    ("chord", chord_mixed_loss),
    ("prefix_rft", prefix_rft_loss),
    ("uft", uft_loss),
    ("exgrpo", exgrpo_token_loss),
):
    register_policy_loss(_name)(_fn)


def update_meta(method, sections, global_steps: int) -> dict:
    """``meta_info["method"]`` of an update: the method's name, its knobs, the step index and the share of expert
    (demonstration) rows in the batch."""
    from dataclasses import asdict

    rollout = sections.workers.rollout
    return {
        "name": method.name,
        "knobs": asdict(getattr(sections.algorithm, method.knobs)),
        "step": int(global_steps) - 1,
        "expert_share": max(int(rollout.n_prefix), 0) / int(rollout.n),
    }


def _hpt_cfg(knobs: dict, meta: dict, loss, actor) -> HptConfig:
    return HptConfig(
        switch_gate=knobs["switch_gate"],
        switch_gate_off=knobs["switch_gate"],
        sft_loss_coef=loss.sft_loss_coef,
        clip_ratio=loss.clip_ratio,
        loss_remove_token_mean=loss.loss_remove_token_mean,
        loss_remove_clip=loss.loss_remove_clip,
    )


def _srft_cfg(knobs: dict, meta: dict, loss, actor) -> SrftConfig:
    return SrftConfig(
        srft_type=knobs["srft_type"],
        sft_weight_scale=knobs["sft_weight_scale"],
        rl_pos_weight_scale=knobs["rl_pos_weight_scale"],
        off_policy_reshape=loss.off_policy_reshape,
        clip_ratio=loss.clip_ratio,
        clip_upper_bound=loss.clip_upper_bound,
        loss_remove_token_mean=loss.loss_remove_token_mean,
        loss_remove_clip=loss.loss_remove_clip,
    )


def _chord_cfg(knobs: dict, meta: dict, loss, actor) -> ChordConfig:
    """Trinity's per-type weights for this rank's mini-batch (``expert_share`` of its rows are expert rows), so
    each term is the per-row mean of its type over the mini-batch. Our actor divides every micro-batch loss by
    ``gradient_accumulation``, with or without dynamic batch size, which is Trinity's fixed-size case
    (``use_dynamic_bsz=False``: ``w_type = gradient_accumulation / rows_of_type``)."""
    from verl.utils.batch_sizes import rank_batch_sizes

    sizes = actor.batch_sizes if actor.batch_sizes is not None else rank_batch_sizes(actor.config)
    mini = sizes.ppo_mini_rows
    expert = max(1, round(mini * meta["expert_share"]))
    return ChordConfig(
        mu_warmup_steps=knobs["mu_warmup_steps"],
        mu_decay_steps=knobs["mu_decay_steps"],
        mu_peak=knobs["mu_peak"],
        mu_valley=knobs["mu_valley"],
        enable_phi_function=knobs["enable_phi_function"],
        clip_range=loss.clip_ratio,
        clip_ratio_c=knobs["clip_ratio_c"],
        use_dynamic_bsz=False,
        ppo_mini_batch_size=sizes.gradient_accumulation,
        ppo_micro_batch_size_per_gpu=1,
        ngpus_trainer=1,
        train_batch_size_usual=max(1, mini - expert),
        train_batch_size_expert=expert,
        use_token_level_loss_in_sft=knobs["use_token_level_loss_in_sft"],
    )


def _prefix_rft_cfg(knobs: dict, meta: dict, loss, actor) -> PrefixRftConfig:
    """The loss reads only the entropy share and the actor's clip / aggregation (the schedule is the driver's)."""
    return PrefixRftConfig(
        prefix_entropy_top_frac=knobs["prefix_entropy_top_frac"],
        clip_ratio=loss.clip_ratio,
        clip_upper_bound=loss.clip_upper_bound,
        loss_remove_token_mean=loss.loss_remove_token_mean,
        loss_remove_clip=loss.loss_remove_clip,
    )


def _uft_cfg(knobs: dict, meta: dict, loss, actor) -> UftLossConfig:
    return UftLossConfig(
        hint_sft_coef=knobs["hint_sft_coef"],
        clip_ratio=loss.clip_ratio,
        clip_upper_bound=loss.clip_upper_bound,
        loss_remove_token_mean=loss.loss_remove_token_mean,
        loss_remove_clip=loss.loss_remove_clip,
    )


def _off(value):
    """LUFFY's clamp keys: -1 (or null) is off."""
    return None if value is None or float(value) == -1 else float(value)


def _exgrpo_cfg(knobs: dict, meta: dict, loss, actor) -> ExgrpoLossConfig:
    """ExGRPO's trainer sends ``loss_remove_clip`` only in the mixed phase and forces PPO clip in warm-up
    (``meta["mixed"]``, luffy_pool/methods/exgrpo.py)."""
    return ExgrpoLossConfig(
        clip_ratio=loss.clip_ratio,
        clip_upper_bound=loss.clip_upper_bound,
        loss_remove_clip=bool(loss.loss_remove_clip and meta.get("mixed", False)),
        loss_remove_token_mean=loss.loss_remove_token_mean,
        off_policy_reshape=loss.off_policy_reshape,
        off_policy_max_clip=_off(loss.off_policy_max_clip),
        off_policy_min_clip=_off(loss.off_policy_min_clip),
        all_max_clip=_off(loss.all_max_clip),
    )


# loss name -> builder of its knob dataclass from (method knobs, update meta, actor loss section, actor)
FAMILY_LOSSES: dict[str, Callable] = {
    "hpt_sft": _hpt_cfg,
    "srft": _srft_cfg,
    "chord": _chord_cfg,
    "prefix_rft": _prefix_rft_cfg,
    "uft": _uft_cfg,
    "exgrpo": _exgrpo_cfg,
}


def family_policy_loss(actor, micro: dict, log_prob, entropy, response_mask):
    """The actor's ``compute_policy_loss`` for a family loss -> (loss, metrics as ``actor/<name>`` floats)."""
    meta = getattr(actor, "method_meta", None)
    if meta is None:
        raise ValueError(
            f"policy loss {actor.policy_loss!r} needs the update's meta_info['method'] (its knobs and "
            f"step), which the trainer sends under the matching algorithm.method"
        )
    cfg = FAMILY_LOSSES[actor.policy_loss](meta["knobs"], meta, actor.update_config.loss, actor)
    mask = response_mask
    if "loss_row_mask" in micro:  # rows a gate dropped take no part in the loss
        mask = response_mask * micro["loss_row_mask"].to(response_mask.dtype).unsqueeze(-1)
    prefix = micro["prefix_mask"]
    inputs = FamilyLossInputs(
        log_prob=log_prob,
        old_log_prob=micro["old_log_probs"],
        advantages=micro["advantages"],
        response_mask=mask,
        prefix_mask=prefix,
        behaviour_log_probs=micro.get("behaviour_log_probs"),
        entropy=entropy.detach(),
        expert_mask=prefix.bool().any(-1),
        correct_mask=(micro["row_scores"] == 1.0) if "row_scores" in micro else None,
        step=meta["step"],
    )
    loss, out = actor.policy_loss_fn(inputs, cfg)
    metrics = {f"actor/{k}": float(v.item() if torch.is_tensor(v) else v) for k, v in out.items()}
    metrics["actor/pg_loss"] = loss.item()
    extra = actor.extra_policy_loss(out, metrics)
    return (loss if extra is None else loss + extra), metrics
