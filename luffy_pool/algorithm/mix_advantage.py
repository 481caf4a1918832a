"""Driver-side advantage of the mixed batch: the estimator registered as ``algorithm.adv_estimator``, then LUFFY's
post-processing, once.

:func:`compute_advantage` builds the estimator's inputs (``AdvantageInputs``: rewards, response mask, uids, the
on-policy rows, a critic's values) and knobs (``AdvantageConfig``: the ``algorithm`` knobs) and calls
``fn(inputs, cfg)``: verl's advantage (``grpo`` keeps off-policy rows inside the group statistics, ``grpo_split``
excludes them; docs/METHOD.md §1.7). :func:`postprocess_advantage` is the stage the trainer runs after it, whatever
the estimator: LUFFY's α/β prefix weights, zero on truncated rows, the SFT prefix advantage and the response mask
(:class:`MixedAdvantageConfig`, from the rollout, data and actor sections), so no estimator has to apply it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import luffy_pool.algorithm.mix_core_alg  # noqa: F401 -- registers grpo_split
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, truncated_rows
from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs


@dataclass(frozen=True)
class MixedAdvantageConfig:
    """LUFFY's post-processing of the advantage, in this order (docs/METHOD.md §1.7): ``A ← A·(α·P + β·¬P)``
    (``rollout.prefix_reward_weight_alpha/beta``, P = prefix token), ``A = 0`` on truncated rows
    (``data.disable_truncation_advantage``), ``A = sft_prefix_advantage`` on prefix tokens
    (``actor.sft_prefix_reward_weight / rollout.n`` with ``actor.use_sft_prefix_reward``, else None), then ``A·m``."""

    prefix_reward_weight_alpha: float
    prefix_reward_weight_beta: float
    disable_truncation_advantage: bool
    sft_prefix_advantage: Optional[float]


def advantage_config(sections) -> AdvantageConfig:
    """The estimator's knobs for a run (``sections``: its ``luffy_pool.config.sections.ConfigSections``)."""
    algo = sections.algorithm
    return AdvantageConfig(gamma=algo.gamma, lam=algo.lam, grpo_use_std=algo.grpo_use_std)


def mixed_advantage_config(sections, n_samples: int) -> MixedAdvantageConfig:
    """The post-processing knobs for a run (``n_samples``: responses per prompt, the denominator of the SFT prefix
    advantage)."""
    rollout, actor = sections.workers.rollout, sections.actor
    return MixedAdvantageConfig(
        prefix_reward_weight_alpha=rollout.prefix_reward_weight_alpha,
        prefix_reward_weight_beta=rollout.prefix_reward_weight_beta,
        disable_truncation_advantage=sections.data.disable_truncation_advantage,
        sft_prefix_advantage=actor.sft_prefix_reward_weight / n_samples if actor.use_sft_prefix_reward else None,
    )


def compute_advantage(sections, batch, uids, response_length: int):
    """``(advantages, returns)`` ``[rows, L]`` of the estimator ``algorithm.adv_estimator`` on the merged batch
    (tensors in ``batch``), as verl's estimator returns them."""
    inputs = AdvantageInputs(
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["attention_mask"][:, -response_length:],
        index=uids,
        on_policy_mask=~batch["prefix_mask"].bool().any(-1),
        values=batch["values"] if "values" in batch.keys() else None,
    )
    return get_adv_estimator_fn(sections.algorithm.adv_estimator)(inputs, advantage_config(sections))


@torch.no_grad()
def postprocess_advantage(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    prefix_mask: torch.Tensor,
    cfg: MixedAdvantageConfig,
    responses: Optional[torch.Tensor] = None,
    pad_token_id: Optional[int] = None,
    eos_token_id=None,
) -> torch.Tensor:
    """LUFFY's post-processing (:class:`MixedAdvantageConfig`, in its order) of an estimator's ``advantages``;
    ``prefix_mask`` marks the off-policy tokens, and ``responses`` with the tokenizer's ``pad_token_id`` /
    ``eos_token_id`` (an int or a list of ints: every stop id the engines use) find the truncated rows. The
    returns are not post-processed."""
    prefix = prefix_mask.bool()
    dtype = advantages.dtype
    alpha, beta = cfg.prefix_reward_weight_alpha, cfg.prefix_reward_weight_beta
    advantages = advantages * (alpha * prefix.to(dtype) + beta * (~prefix).to(dtype))
    if cfg.disable_truncation_advantage:
        cut = truncated_rows(responses, pad_token_id, eos_token_id, response_mask.shape[-1])
        advantages = advantages.masked_fill(cut.unsqueeze(-1), 0.0)
    if cfg.sft_prefix_advantage is not None:
        advantages = advantages.masked_fill(prefix, cfg.sft_prefix_advantage)
    return advantages * response_mask.to(dtype)


def postprocess_batch_advantage(
    advantages: torch.Tensor,
    sections,
    batch,
    response_length: int,
    n_samples: int,
    pad_token_id: int | None = None,
    eos_token_id=None,
) -> torch.Tensor:
    """:func:`postprocess_advantage` of the merged batch's advantage with the run's knobs."""
    return postprocess_advantage(
        advantages,
        batch["attention_mask"][:, -response_length:],
        batch["prefix_mask"],
        mixed_advantage_config(sections, n_samples),
        responses=batch["responses"],
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
    )


def compute_mixed_advantage(
    sections, batch, uids, response_length: int, n_samples: int, pad_token_id: int | None = None, eos_token_id=None
):
    """Return ``(advantages, returns)`` ``[rows, L]`` for the merged batch as a training step computes them: the
    estimator (:func:`compute_advantage`), then the post-processing (:func:`postprocess_batch_advantage`)."""
    advantages, returns = compute_advantage(sections, batch, uids, response_length)
    advantages = postprocess_batch_advantage(
        advantages, sections, batch, response_length, n_samples, pad_token_id, eos_token_id
    )
    return advantages, returns
