"""LUFFY's actor update: the mixed on/off-policy token loss on top of the data-parallel actor.

Off-policy tokens (``prefix_mask``) are weighted by the shaped probability f(p) = p/(p+γ); on-policy
tokens keep the (optionally clipped / reshaped) importance ratio (LUFFY_SPEC §1.9). With
``use_sft_multitask_loss`` off-policy rows get a plain NLL term instead (the "RL w/ SFT loss"
baseline); with neither flag the plain verl PPO loss applies. The adaptive entropy coefficient
(``use_adaptive_temperature``) also lives here because it is LUFFY-only.
"""
from __future__ import annotations

import math

from luffy_pool.mix_core_alg import AdaptiveEntropyCoeff, compute_sft_multitask_loss, compute_token_on_off_policy_loss
from verl.workers.actor.dp_actor import DataParallelPPOActor


def _off(x):
    """LUFFY uses -1 for 'no clamp'; the loss functions take None."""
    return None if x is None or x == -1 else x


class MIXDataParallelPPOActor(DataParallelPPOActor):
    """Data-parallel actor whose loss understands ``prefix_mask`` (off-policy tokens)."""

    def __init__(self, config, actor_module, actor_optimizer=None, **kw):
        super().__init__(config, actor_module, actor_optimizer, **kw)
        if config.get("use_off_policy_loss", False) and config.get("use_sft_multitask_loss", False):
            raise ValueError("actor.use_off_policy_loss and actor.use_sft_multitask_loss cannot both be True")
        self.adaptive_entropy = None
        if config.get("use_adaptive_temperature", False) or config.get("use_adaptive_temperature_fixed", False):
            self.adaptive_entropy = AdaptiveEntropyCoeff(
                entropy_coeff=config.entropy_coeff, target_entropy=config.adaptive_temperature_target_entropy,
                alpha_lr=config.get("alpha_lr", 1e-2), clip=config.get("adaptive_temperature_clip", -1),
                fixed=config.get("use_adaptive_temperature_fixed", False))

    def loss_input_keys(self) -> list[str]:
        keys = super().loss_input_keys() + ["prefix_mask"]
        if self.config.get("use_off_policy_probs", False):
            keys.append("target_probs")
        return keys

    def compute_policy_loss(self, micro, log_prob, entropy, response_mask):
        cfg = self.config
        if cfg.get("use_off_policy_loss", False):
            out = compute_token_on_off_policy_loss(
                old_log_prob=micro["old_log_probs"], log_prob=log_prob, advantages=micro["advantages"],
                eos_mask=response_mask, cliprange=cfg.clip_ratio, clip_upper_bound=cfg.get("clip_upper_bound", 1.0),
                prefix_mask=micro["prefix_mask"], off_cliprange=cfg.get("off_policy_cliprange", None),
                off_normalize=cfg.get("off_policy_normalize", False),
                off_max_clip=_off(cfg.get("off_policy_max_clip", -1)), off_min_clip=_off(cfg.get("off_policy_min_clip", -1)),
                all_max_clip=_off(cfg.get("all_max_clip", -1)),
                off_policy_reshape=cfg.get("off_policy_reshape", "no_reshape"),
                off_policy_reshape_weight=cfg.get("off_policy_reshape_weight", 1.0),
                off_policy_reshape_pow_exp=cfg.get("off_policy_reshape_pow_exp", 0.5),
                on_policy_reshape=cfg.get("on_policy_reshape", "no_reshape"),
                on_policy_reshape_weight=cfg.get("on_policy_reshape_weight", 1.0),
                on_policy_reshape_pow_exp=cfg.get("on_policy_reshape_pow_exp", 0.5),
                target_probs=micro.get("target_probs") if cfg.get("use_off_policy_probs", False) else None,
                loss_remove_token_mean=cfg.get("loss_remove_token_mean", False),
                loss_remove_clip=cfg.get("loss_remove_clip", False))
            metrics = {f"actor/{k}": v.item() for k, v in out.items() if k != "pg_loss"}
        elif cfg.get("use_sft_multitask_loss", False):
            out = compute_sft_multitask_loss(
                old_log_prob=micro["old_log_probs"], log_prob=log_prob, advantages=micro["advantages"],
                eos_mask=response_mask, prefix_mask=micro["prefix_mask"], cliprange=cfg.clip_ratio,
                clip_upper_bound=cfg.get("clip_upper_bound", 1.0), sft_loss_coef=cfg.get("sft_loss_coef", 1.0),
                loss_remove_token_mean=cfg.get("loss_remove_token_mean", False),
                loss_remove_clip=cfg.get("loss_remove_clip", False))
            metrics = {f"actor/{k}": v.item() for k, v in out.items() if k != "pg_loss"}
        else:
            return super().compute_policy_loss(micro, log_prob, entropy, response_mask)
        pg_loss = out["pg_loss"]
        if cfg.get("use_ppo_kl_loss", False):
            ppo_kl_loss = out["ppo_kl"].abs()
            pg_loss = pg_loss + cfg.get("ppo_kl_loss_coef", 1.0) * ppo_kl_loss
            metrics["actor/ppo_kl_loss"] = ppo_kl_loss.item()
        metrics["actor/pg_loss"] = out["pg_loss"].item()
        return pg_loss, metrics

    def entropy_coeff(self, entropy_value) -> float:
        if self.adaptive_entropy is None:
            return self.config.entropy_coeff
        return self.adaptive_entropy.coefficient(entropy_value)

    def _regularisers(self, micro, log_prob, entropy, response_mask, metrics):
        loss = super()._regularisers(micro, log_prob, entropy, response_mask, metrics)
        if self.adaptive_entropy is not None:
            metrics.update(self.adaptive_entropy.accumulate(metrics["actor/entropy_loss"]))
        return loss

    def _optimizer_step(self) -> float:
        grad_norm = super()._optimizer_step()
        if self.adaptive_entropy is not None:
            if math.isfinite(grad_norm):
                self.adaptive_entropy.step()
            elif self.adaptive_entropy.optimizer is not None:
                # a skipped step must not move log-alpha either: its gradient came from the same NaN batch
                self.adaptive_entropy.optimizer.zero_grad()
        return grad_norm
