"""LUFFY's actor: the data-parallel actor plus what LUFFY adds around the policy loss.

The loss itself is selected and called by the base actor (``actor.policy_loss``; under ``auto`` LUFFY's switches
choose ``luffy_token`` (use_off_policy_loss), ``sft_multitask`` (use_sft_multitask_loss) or ``vanilla``;
docs/METHOD.md §1.9). This class adds the tensors LUFFY's losses read (``prefix_mask``, and the behaviour
log-probs with ``use_off_policy_probs``), the ``use_ppo_kl_loss`` term, and the adaptive entropy coefficient
(``use_adaptive_temperature``), which are LUFFY-only; and the tokens the entropy bonus and KL loss cover for a
method that keeps its prefix tokens out of them (``Method.regularise_prefix_tokens``).
"""

from __future__ import annotations

import math

import torch

from luffy_pool.algorithm.mix_core_alg import (
    AdaptiveEntropyCoeff,
)  # also registers luffy_token / sft_multitask / grpo_split
from luffy_pool.config.sections import LuffyActorSection
from luffy_pool.methods import METHODS  # importing it registers each method's loss under the method's name
from luffy_pool.methods.losses import method_policy_loss
from verl.workers.actor.dp_actor import DataParallelPPOActor


class MIXDataParallelPPOActor(DataParallelPPOActor):
    """Data-parallel actor whose loss understands ``prefix_mask`` (off-policy tokens)."""

    section_cls = LuffyActorSection

    def __init__(self, config, actor_module, actor_optimizer=None, **kw):
        super().__init__(config, actor_module, actor_optimizer, **kw)
        self.adaptive_entropy = None
        self.method_selection = None  # algorithm.method and its frozen knobs, set once at init (set_method)
        if self.update_config is None:  # a log-prob-only actor: no loss
            return
        self.loss_cfg = loss = self.update_config.loss
        if loss.use_adaptive_temperature or loss.use_adaptive_temperature_fixed:
            self.adaptive_entropy = AdaptiveEntropyCoeff(
                entropy_coeff=loss.entropy_coeff,
                target_entropy=loss.adaptive_temperature_target_entropy,
                alpha_lr=loss.alpha_lr,
                clip=loss.adaptive_temperature_clip,
                fixed=loss.use_adaptive_temperature_fixed,
            )

    def loss_input_keys(self) -> list[str]:
        keys = super().loss_input_keys() + ["prefix_mask"]
        if self.loss_cfg.use_off_policy_probs:
            keys.append("behaviour_log_probs")
        # per-row tensors the method's hooks add for its loss (Method.batch_keys); loaded when present
        if self.method_selection is not None:
            from luffy_pool.methods import get_method

            keys += list(get_method(self.method_selection.name).batch_keys)
        return keys

    def set_method(self, selection) -> None:
        """``algorithm.method`` and its frozen knob section (``MethodSelection``), once, when the worker starts."""
        self.method_selection = selection

    def compute_policy_loss(self, micro, log_prob, entropy, response_mask, global_steps=None, update_state=None):
        method = METHODS.get(self.policy_loss)
        if method is not None and method.loss is not None:  # a method's loss (registered under its name)
            if self.method_selection is None or self.method_selection.name != method.name:
                chosen = None if self.method_selection is None else self.method_selection.name
                raise ValueError(
                    f"policy loss {self.policy_loss!r} is algorithm.method={method.name}'s loss, but this actor was "
                    f"started with algorithm.method={chosen}"
                )
            return method_policy_loss(self, micro, log_prob, entropy, response_mask, global_steps, update_state)
        return super().compute_policy_loss(micro, log_prob, entropy, response_mask, global_steps, update_state)

    def extra_policy_loss(self, loss_metrics, metrics):
        """``use_ppo_kl_loss``: ``ppo_kl_loss_coef·|ppo_kl|`` of the registered loss's ``ppo_kl``."""
        if not self.loss_cfg.use_ppo_kl_loss:
            return None
        if "ppo_kl" not in loss_metrics:
            raise ValueError(f"actor.use_ppo_kl_loss=True but policy loss {self.policy_loss!r} returns no 'ppo_kl'")
        ppo_kl_loss = loss_metrics["ppo_kl"].abs()
        metrics["actor/ppo_kl_loss"] = ppo_kl_loss.item()
        return self.loss_cfg.ppo_kl_loss_coef * ppo_kl_loss

    def entropy_coeff(self, entropy_value) -> float:
        if self.adaptive_entropy is None:
            return self.update_config.entropy_coeff
        return self.adaptive_entropy.coefficient(entropy_value)

    def regularised_tokens(self, micro, response_mask):
        """The response tokens the entropy bonus and the KL loss average over: all of them, or with a method that
        declares ``regularise_prefix_tokens=False`` (UFT: its hint is prompt text) those outside ``prefix_mask``."""
        if self.method_selection is None or "prefix_mask" not in micro:
            return response_mask
        if METHODS[self.method_selection.name].regularise_prefix_tokens:
            return response_mask
        return response_mask * (~micro["prefix_mask"].bool()).to(response_mask.dtype)

    def _regularisers(self, micro, log_prob, entropy, response_mask, metrics):
        mask = self.regularised_tokens(micro, response_mask)
        if mask is not response_mask and not bool(mask.any()):
            # a micro-batch of prefix tokens only: no token the regularisers cover (0, not an empty mean's NaN)
            metrics["actor/entropy_loss"] = 0.0
            loss = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
        else:
            loss = super()._regularisers(micro, log_prob, entropy, mask, metrics)
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
