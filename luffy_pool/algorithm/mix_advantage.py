"""Driver-side advantage of the mixed batch: one call of the estimator registered as ``algorithm.adv_estimator``.

``compute_mixed_advantage`` builds the estimator's inputs (``AdvantageInputs``: rewards, response mask, uids,
the on-policy rows, the prefix tokens, the responses for truncation) and its knobs (``AdvantageConfig``: the
``algorithm`` knobs and LUFFY's post-processing ``MixedAdvantageConfig`` from the rollout, data and actor sections),
and calls ``fn(inputs, cfg)`` once; the estimator returns the finished advantage (``grpo`` keeps off-policy rows
inside the group statistics, ``grpo_split`` excludes them; docs/METHOD.md §1.7).
"""

from __future__ import annotations

import luffy_pool.algorithm.mix_core_alg  # noqa: F401 -- registers grpo_split
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs, MixedAdvantageConfig


def advantage_config(sections, n_samples: int) -> AdvantageConfig:
    """The estimator's knobs for a run (``sections``: its ``luffy_pool.config.sections.ConfigSections``;
    ``n_samples``: responses per prompt, the denominator of the SFT prefix advantage)."""
    algo, rollout, actor = sections.algorithm, sections.workers.rollout, sections.actor
    mixed = MixedAdvantageConfig(
        prefix_reward_weight_alpha=rollout.prefix_reward_weight_alpha,
        prefix_reward_weight_beta=rollout.prefix_reward_weight_beta,
        disable_truncation_advantage=sections.data.disable_truncation_advantage,
        sft_prefix_advantage=actor.sft_prefix_reward_weight / n_samples if actor.use_sft_prefix_reward else None,
    )
    return AdvantageConfig(gamma=algo.gamma, lam=algo.lam, grpo_use_std=algo.grpo_use_std, mixed=mixed)


def compute_mixed_advantage(
    sections, batch, uids, response_length: int, n_samples: int, pad_token_id: int | None = None, eos_token_id=None
):
    """Return ``(advantages, returns)`` ``[rows, L]`` for the merged batch (tensors in ``batch``); ``eos_token_id``: the
    stop id, or every stop id the engines use (a response ending on one is not truncated)."""
    prefix_mask = batch["prefix_mask"]
    inputs = AdvantageInputs(
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["attention_mask"][:, -response_length:],
        index=uids,
        on_policy_mask=~prefix_mask.bool().any(-1),
        values=batch["values"] if "values" in batch.keys() else None,
        prefix_mask=prefix_mask,
        responses=batch["responses"],
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
    )
    return get_adv_estimator_fn(sections.algorithm.adv_estimator)(inputs, advantage_config(sections, n_samples))
