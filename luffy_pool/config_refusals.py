"""Keys and values of LUFFY's config that this framework accepts only so LUFFY configs parse, each with
the one-line reason it gives when a run asks for more.

Every key of mix_ppo_trainer.yaml either acts or appears here: a key read by no code path (inert in
LUFFY too, or tied to a part that is not shipped) is accepted at its YAML default only; a section that
is not shipped (critic, model-based reward workers) is refused by name with what to use instead.
``luffy_pool.config_check`` applies these tables; this module only states them.
"""
from __future__ import annotations

_A = "actor_rollout_ref.actor"
_R = "actor_rollout_ref.rollout"

# LUFFY YAML sections that are deliberately absent; their keys get this explanation instead of a guess.
NOT_SHIPPED_SECTIONS = {
    "critic": "the critic (value model) is not shipped; adv_estimator=gae is unsupported, use grpo",
    "reward_model": "model-based reward workers are not shipped; use reward.* (rule grader or reward.orm judge)",
}

_INERT = "the key is inert in LUFFY (read by no code path)"
_ACC_REBATCH = "it only acts with trainer.acc_rebatch=True, which is not shipped"
_RM_ONLY = "it is only used by model-based reward workers, which are not shipped"
# Keys LUFFY parses but never acts on (spec §2.2 "Inert keys") or whose feature is not shipped: accepted at the
# YAML default only, so LUFFY configs parse while a key never silently does nothing.
INERT_KEYS = {
    "data.return_raw_input_ids": _RM_ONLY,
    "data.return_raw_chat": _RM_ONLY,
    "data.filter_targets": _INERT,
    "data.filter_accuracy": _ACC_REBATCH,
    "data.accuracy_lower_bound": _ACC_REBATCH,
    "data.accuracy_upper_bound": _ACC_REBATCH,
    "data.add_tgt_with_acc": "it only changes use_sft_prefix_reward's group size in LUFFY and is not shipped",
    "data.add_tgt_acc_upper_bound": _INERT,
    f"{_A}.use_sft_reward": _INERT,
    f"{_A}.off_policy_cliprange": "LUFFY's token loss receives it but never uses it",
    f"{_A}.use_off_policy_clip": _INERT,
    f"{_A}.debug": _INERT,
    f"{_A}.use_target_lst": _INERT,
    f"{_R}.prefix_linear_max_var": _INERT,
    f"{_R}.prefix_reward_strategy": _INERT,
    "algorithm.lam": "only GAE reads it, and gae needs a critic, which is not shipped",
    "algorithm.surprisal_base": _INERT,
    "trainer.rejection_sample": _INERT,
    "trainer.rejection_sample_multiplier": _INERT,
    "trainer.debug": "LUFFY's breakpoint() switch is not shipped",
    "trainer.add_full_target_when_none": "it is a no-op branch in LUFFY",
    "trainer.skip_valid_mask": "it only affects LUFFY's unused valid_mask",
    "trainer.acc_rebatch": "LUFFY's accuracy-rebatching trainer (mix_trainer_acc_rebatch) is not shipped",
    "trainer.skip_by_step": _INERT,
}

# Values that exist in LUFFY but are not shipped: a specific explanation instead of the enum list.
UNSUPPORTED_VALUES = {
    ("algorithm.adv_estimator", "gae"): "needs a critic (value model), which is not shipped; use grpo",
    (f"{_A}.off_policy_loss_impl", "seq"): "is not implemented in LUFFY either; use token",
}
# Switches that must stay False (True names a feature that is not shipped), with the reason.
REJECTED_WHEN_TRUE = {
    "reward_model.enable": "model-based reward workers are not shipped; use reward.orm for a judge",
    f"{_A}.fsdp_config.grad_offload": "FSDP2 keeps gradients with their parameters; use param_offload",
    f"{_A}.off_policy_normalize": "it only feeds LUFFY's unimplemented seq loss",
    # LUFFY's `resume_from_path: False` means "no path"; True names no checkpoint.
    "trainer.resume_from_path": "give a checkpoint path, or False / null for none",
}
# Switches that must stay True, with the reason.
REJECTED_WHEN_FALSE = {
    "actor_rollout_ref.hybrid_engine": "actor, rollout and ref share one worker per rank (the only mode LUFFY runs)",
}
