"""Driver-side advantage of the mixed batch: registered estimator, then LUFFY's post-processing.

``compute_mixed_advantage`` looks the estimator up by ``algorithm.adv_estimator`` (``grpo`` keeps
off-policy rows inside the group statistics, ``grpo_split`` excludes them; docs/METHOD.md §1.7), calls it as
``fn(AdvantageInputs, algorithm_section)`` (verl/trainer/ppo/loss_inputs.py), and then applies, in order:
prefix/non-prefix weights α/β, zero advantage for truncated rows (``data.disable_truncation_advantage``)
and the constant SFT prefix reward (``actor.use_sft_prefix_reward``).
"""
from __future__ import annotations

import luffy_pool.algorithm.mix_core_alg as mix_alg  # registers grpo_split
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.loss_inputs import AdvantageInputs


def compute_mixed_advantage(sections, batch, uids, response_length: int, n_samples: int,
                            pad_token_id: int | None = None, eos_token_id: int | None = None):
    """Return ``(advantages, returns)`` ``[rows, L]`` for the merged batch (tensors in ``batch``); ``sections``
    is the run's ``luffy_pool.config.sections.ConfigSections``."""
    algo = sections.algorithm
    rewards = batch["token_level_rewards"]
    response_mask = batch["attention_mask"][:, -response_length:]
    prefix_mask = batch["prefix_mask"]
    inputs = AdvantageInputs(token_level_rewards=rewards, response_mask=response_mask, index=uids,
                             on_policy_mask=~prefix_mask.bool().any(-1),
                             values=batch["values"] if "values" in batch.keys() else None)
    adv, returns = get_adv_estimator_fn(algo.adv_estimator)(inputs, algo)
    rollout = sections.workers.rollout
    adv = mix_alg.apply_prefix_reward_weights(adv, prefix_mask, rollout.prefix_reward_weight_alpha,
                                              rollout.prefix_reward_weight_beta)
    if sections.data.disable_truncation_advantage:
        adv = mix_alg.zero_truncated_advantages(adv, batch["responses"], pad_token_id, eos_token_id, response_length)
    if sections.actor.use_sft_prefix_reward:
        adv = mix_alg.apply_sft_prefix_reward(adv, prefix_mask, sections.actor.sft_prefix_reward_weight, n_samples)
    return adv * response_mask.to(adv.dtype), returns
