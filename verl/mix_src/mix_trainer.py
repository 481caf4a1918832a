"""LUFFY's module path ``verl.mix_src.mix_trainer``: the trainer (``luffy_pool.trainer.mix_trainer``) and LUFFY's
three ``DataProto`` helpers, as adapters over this package's functions:

- ``apply_kl_penalty(data, kl_ctrl, kl_penalty)`` -> ``(data, metrics)``: KL-in-reward into
  ``token_level_rewards`` (beta = 0 without ``ref_log_prob``), ``verl.trainer.ppo.kl.apply_kl_penalty``;
- ``compute_advantage(data, adv_estimator, gamma, lam, grpo_use_std)`` -> ``data`` with ``advantages`` and
  ``returns``: the registered estimator (``grpo``, ``grpo_split``, ``reinforce``, ...), groups by ``uid``;
- ``compute_data_metrics_ours(batch, use_critic)``: ``verl.trainer.ppo.metric_utils.compute_data_metrics``.
"""

from __future__ import annotations

from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs
from verl.trainer.ppo.kl import apply_kl_penalty as _apply_kl_penalty
from verl.trainer.ppo.metric_utils import compute_data_metrics

__all__ = ["MIXRayPPOTrainer", "apply_kl_penalty", "compute_advantage", "compute_data_metrics_ours"]


def _response_mask(data):
    width = data.batch["responses"].size(-1)
    return data.batch["attention_mask"][:, -width:]


def apply_kl_penalty(data, kl_ctrl, kl_penalty: str = "kl"):
    tensors = data.batch
    ref = tensors["ref_log_prob"] if "ref_log_prob" in tensors.keys() else None
    old = tensors["old_log_probs"] if ref is not None else None
    rewards, metrics = _apply_kl_penalty(
        tensors["token_level_scores"], old, ref, _response_mask(data), kl_ctrl, kl_penalty
    )
    data.batch["token_level_rewards"] = rewards
    return data, metrics


def compute_advantage(data, adv_estimator: str, gamma: float = 1.0, lam: float = 1.0, grpo_use_std: bool = True):
    tensors = data.batch
    on_policy = ~tensors["prefix_mask"].bool().any(-1) if "prefix_mask" in tensors.keys() else None
    inputs = AdvantageInputs(
        token_level_rewards=tensors["token_level_rewards"],
        response_mask=_response_mask(data),
        index=data.non_tensor_batch["uid"],
        on_policy_mask=on_policy,
        values=tensors["values"] if "values" in tensors.keys() else None,
    )
    advantages, returns = get_adv_estimator_fn(adv_estimator)(
        inputs, AdvantageConfig(gamma=gamma, lam=lam, grpo_use_std=grpo_use_std)
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


def compute_data_metrics_ours(batch, use_critic: bool = True) -> dict:
    """LUFFY's batch statistics (score, reward, advantage, lengths, on/off-policy split); no critic is shipped."""
    return compute_data_metrics(batch.batch, batch.batch["responses"].size(-1))
