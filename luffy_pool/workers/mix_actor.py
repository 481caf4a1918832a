"""LUFFY's actor update: the mixed on/off-policy token loss on top of the data-parallel actor.

Off-policy tokens (``prefix_mask``) are weighted by the shaped probability f(p) = p/(p+γ); on-policy
tokens keep the (optionally clipped / reshaped) importance ratio (docs/METHOD.md §1.9). With
``use_sft_multitask_loss`` off-policy rows get a plain NLL term instead (the "RL w/ SFT loss"
baseline); with neither flag the plain verl PPO loss applies. The loss is looked up by name in the
policy-loss registry and called as ``fn(PolicyLossInputs, cfg)`` (luffy_pool/algorithm/loss_config.py gives the name and
``cfg``). The adaptive entropy coefficient (``use_adaptive_temperature``) also lives here because it is LUFFY-only.
"""
from __future__ import annotations

import math

from luffy_pool.config.sections import LossSection, LuffyActorSection
from luffy_pool.algorithm.loss_config import policy_loss_name, policy_loss_section
from luffy_pool.algorithm.mix_core_alg import AdaptiveEntropyCoeff  # also registers luffy_token / sft_multitask / grpo_split
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.trainer.ppo.loss_inputs import PolicyLossInputs
from verl.workers.actor.dp_actor import DataParallelPPOActor


class MIXDataParallelPPOActor(DataParallelPPOActor):
    """Data-parallel actor whose loss understands ``prefix_mask`` (off-policy tokens)."""

    def __init__(self, config, actor_module, actor_optimizer=None, **kw):
        super().__init__(config, actor_module, actor_optimizer, **kw)
        section = self.update_config
        # the loss view of the actor section (the worker's, built at start), else built from ``config``
        self.loss_cfg = loss = section.loss if isinstance(section, LuffyActorSection) else LossSection.from_actor_config(config)
        if loss.use_off_policy_loss and loss.use_sft_multitask_loss:
            raise ValueError("actor.use_off_policy_loss and actor.use_sft_multitask_loss cannot both be True")
        self.policy_loss = policy_loss_name(loss)
        # the loss's own section, built once; an unknown name fails here, naming the registered ones
        self.policy_loss_cfg = policy_loss_section(config, self.policy_loss, loss)
        self.policy_loss_fn = get_policy_loss_fn(self.policy_loss)
        self.adaptive_entropy = None
        if loss.use_adaptive_temperature or loss.use_adaptive_temperature_fixed:
            self.adaptive_entropy = AdaptiveEntropyCoeff(
                entropy_coeff=loss.entropy_coeff, target_entropy=loss.adaptive_temperature_target_entropy,
                alpha_lr=loss.alpha_lr, clip=loss.adaptive_temperature_clip,
                fixed=loss.use_adaptive_temperature_fixed)

    def loss_input_keys(self) -> list[str]:
        keys = super().loss_input_keys() + ["prefix_mask"]
        if self.loss_cfg.use_off_policy_probs:
            keys.append("behaviour_log_probs")
        return keys

    def compute_policy_loss(self, micro, log_prob, entropy, response_mask):
        """The registered loss ``policy_loss_name(config)`` on this micro-batch (luffy_pool/algorithm/loss_config.py)."""
        cfg = self.loss_cfg
        inputs = PolicyLossInputs(log_prob=log_prob, old_log_prob=micro.get("old_log_probs"),
                                  advantages=micro.get("advantages"), response_mask=response_mask,
                                  prefix_mask=micro.get("prefix_mask"),
                                  behaviour_log_probs=micro.get("behaviour_log_probs") if cfg.use_off_policy_probs
                                  else None)
        pg_loss, out = self.policy_loss_fn(inputs, self.policy_loss_cfg)
        metrics = {f"actor/{k}": v.item() for k, v in out.items()}
        raw_pg_loss = pg_loss
        if cfg.use_ppo_kl_loss:
            if "ppo_kl" not in out:
                raise ValueError(f"actor.use_ppo_kl_loss=True but policy loss {self.policy_loss!r} returns no 'ppo_kl'")
            ppo_kl_loss = out["ppo_kl"].abs()
            pg_loss = pg_loss + cfg.ppo_kl_loss_coef * ppo_kl_loss
            metrics["actor/ppo_kl_loss"] = ppo_kl_loss.item()
        metrics["actor/pg_loss"] = raw_pg_loss.item()
        return pg_loss, metrics

    def entropy_coeff(self, entropy_value) -> float:
        if self.adaptive_entropy is None:
            return self.update_config.entropy_coeff
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
