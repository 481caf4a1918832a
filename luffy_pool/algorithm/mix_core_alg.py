"""LUFFY's mixed-policy algorithm as registered ``fn(inputs, cfg)`` functions: the group advantage over on- and
off-policy rows, the token-level on/off-policy loss with policy shaping f(p) = p/(p+γ), the SFT multi-task loss,
and the adaptive entropy coefficient (docs/METHOD.md §1.7, §1.9).

Importing this module registers ``grpo_split`` (advantage) and ``luffy_token`` / ``sft_multitask`` (policy
losses, selected under ``policy_loss=auto`` by ``use_off_policy_loss`` / ``use_sft_multitask_loss``) in the
registries of :mod:`verl.trainer.ppo.core_algos`, each loss with the token sets its metrics average over and its
rollout-correction support. LUFFY's post-processing of the advantage is the driver's stage after the estimator
(:mod:`luffy_pool.algorithm.mix_advantage`). LUFFY's own signatures (``compute_token_on_off_policy_loss``,
``compute_grpo_outcome_advantage_split``, ...) are thin aliases of these in ``verl.mix_src.mix_core_alg``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from verl.trainer.ppo.core_algos import (
    aggregate_token_loss,
    broadcast_sequence_advantage,
    clipped_pg_losses,
    group_normalized_scores,
    ppo_clip_loss,
    register_adv_est,
    register_policy_loss,
    sequence_scores,
)
from verl.trainer.ppo.loss_inputs import AdvantageInputs, PolicyLossInputs, clamp_bound
from verl.utils import torch_functional as verl_F

ON_POLICY_RESHAPES = ("no_reshape", "logp", "p_logp", "square_root", "pow", "p_div_p_0.1", "p_div_p_0.5")
OFF_POLICY_RESHAPES = (
    "no_reshape",
    "logp",
    "p_logp",
    "square_root",
    "pow",
    "p_div_p_0.1",
    "p_div_p_0.3",
    "p_div_p_0.5",
)
_SHAPING_GAMMA = {"p_div_p_0.1": 0.1, "p_div_p_0.3": 0.3, "p_div_p_0.5": 0.5}


# ----------------------------------------------------------------------------------------------------
# Advantage (driver side)
# ----------------------------------------------------------------------------------------------------
@register_adv_est("grpo_split")
@torch.no_grad()
def grpo_split_advantage(inputs: AdvantageInputs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """``grpo_split``: GRPO with statistics from the on-policy rows of each group only (docs/METHOD.md §1.7).

    μ_G, σ_G (unbiased) over rows with ``inputs.on_policy_mask`` True (= no prefix token); one such row →
    μ=0, σ=1; σ=0 → 1. Every row, off-policy ones included, gets ``(s_i − μ_G)/(σ_G + ε)``, or ``s_i − μ_G``
    without ``cfg.grpo_use_std``. A group with no on-policy row raises ValueError.
    """
    if inputs.on_policy_mask is None:
        raise ValueError("adv_estimator='grpo_split' needs on_policy_mask (the rows without prefix tokens)")
    seq_adv = group_normalized_scores(
        sequence_scores(inputs.token_level_rewards),
        inputs.index,
        use_std=cfg.grpo_use_std,
        epsilon=cfg.epsilon,
        stats_mask=inputs.on_policy_mask.bool(),
        zero_std_as_one=True,
    )
    return broadcast_sequence_advantage(seq_adv, inputs.response_mask)


# ----------------------------------------------------------------------------------------------------
# Ratios and shaping
# ----------------------------------------------------------------------------------------------------
def _shaped(prob: torch.Tensor, gamma: float) -> torch.Tensor:
    """Policy shaping ``f(p) = p/(p + γ)``."""
    return prob / (prob + gamma)


def on_policy_ratio(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, reshape: str, weight: float, pow_exp: float
) -> torch.Tensor:
    """On-policy ratio ρ for ``on_policy_reshape`` (d = ℓ − ℓ_old, w = weight, e = pow_exp).

    ``no_reshape``: e^d; ``logp``: d; ``p_logp``: e^d + w·d; ``square_root``: √(e^d);
    ``pow``: (e^d)^e; ``p_div_p_γ``: f(p)/f(p_old) with f(x) = x/(x+γ), γ ∈ {0.1, 0.5}.
    """
    log_ratio = log_prob - old_log_prob
    if reshape == "no_reshape":
        return torch.exp(log_ratio)
    if reshape == "logp":
        return log_ratio
    if reshape == "p_logp":
        return torch.exp(log_ratio) + weight * log_ratio
    if reshape == "square_root":
        return torch.sqrt(torch.exp(log_ratio))
    if reshape == "pow":
        return torch.pow(torch.exp(log_ratio), pow_exp)
    if reshape in ("p_div_p_0.1", "p_div_p_0.5"):
        gamma = _SHAPING_GAMMA[reshape]
        return _shaped(torch.exp(log_prob), gamma) / _shaped(torch.exp(old_log_prob), gamma)
    raise ValueError(f"unknown on_policy_reshape {reshape!r}; valid: {list(ON_POLICY_RESHAPES)}")


def off_policy_weight(log_prob: torch.Tensor, reshape: str, weight: float, pow_exp: float) -> torch.Tensor:
    """Off-policy weight f(p) for ``off_policy_reshape`` (p = exp(ℓ), behaviour prob taken as 1).

    ``no_reshape``: p; ``logp``: w·ℓ; ``p_logp``: p + w·ℓ; ``square_root``: √p; ``pow``: p^e;
    ``p_div_p_γ``: p/(p+γ), γ ∈ {0.1, 0.3, 0.5} (LUFFY: ``p_div_p_0.1``).
    """
    prob = torch.exp(log_prob)
    if reshape == "no_reshape":
        return prob
    if reshape == "logp":
        return weight * log_prob
    if reshape == "p_logp":
        return prob + weight * log_prob
    if reshape == "square_root":
        return torch.sqrt(prob)
    if reshape == "pow":
        return torch.pow(prob, pow_exp)
    if reshape in _SHAPING_GAMMA:
        return _shaped(prob, _SHAPING_GAMMA[reshape])
    raise ValueError(f"unknown off_policy_reshape {reshape!r}; valid: {list(OFF_POLICY_RESHAPES)}")


# ----------------------------------------------------------------------------------------------------
# Losses (actor side): registered as fn(PolicyLossInputs, cfg) -> (loss, metrics); cfg is the actor's
# LossSection (luffy_pool/config/sections.py).
# ----------------------------------------------------------------------------------------------------
# The off-policy metrics are over the prefix tokens, the on-policy ones over the others (actor.metric_aggregation).
LUFFY_TOKEN_METRIC_TOKENS = {
    "actor/off_pg_loss": "off",
    "actor/off_policy_prob": "off",
    "actor/off_ratio_mean": "off",
    "actor/off_ratio_max_clip_frac": "off",
    "actor/off_ratio_min_clip_frac": "off",
    "actor/on_pg_loss": "on",
    "actor/on_policy_prob": "on",
}


@register_policy_loss(
    "luffy_token",
    auto_switch="use_off_policy_loss",
    metric_tokens=LUFFY_TOKEN_METRIC_TOKENS,
    # rollout IS weights multiply the on-policy tokens' term; the off-policy term f(p) reads no old log-prob, so
    # bypass mode's old log-probs on prefix tokens do not reach it
    supports_rollout_is=True,
    supports_bypass_mode=True,
)
def luffy_token_loss(inputs: PolicyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """LUFFY's mixed token loss ``L = P·c·L_off + (1−P)·L_on`` (docs/METHOD.md §1.9), aggregated over ``m``.

    On-policy: ``L_on = −A·ρ`` (:func:`on_policy_ratio` with ``on_policy_reshape*``), with the PPO clip
    ``max(−A·ρ, −A·clip(ρ, 1−ε, max(clip_upper_bound, 1+ε)))`` (ε = ``clip_ratio``) unless ``loss_remove_clip``.
    Off-policy: ``L_off = −A·f(p)`` (:func:`off_policy_weight` with ``off_policy_reshape*``), or
    ``f = p/(π_b + 1e-6)`` with ``π_b = exp(behaviour_log_probs)`` when the inputs carry them (tokens whose
    behaviour is NaN, unknown, keep ``f(p)``); ``f`` is then clamped to ``[off_policy_min_clip,
    off_policy_max_clip]`` (-1 = off). No old log-prob, no trust region. ``c = off_policy_loss_coef`` (1 in
    LUFFY). ``all_max_clip`` (-1 = off) drops tokens with ``p > all_max_clip`` from the loss. Aggregation:
    ``Σ L·m / width`` if ``loss_remove_token_mean``, else ``Σ L·m / Σ m``. With rollout correction ``L_on`` is
    multiplied by ``inputs.rollout_is_weights`` (``on_pg_loss`` after it). Metrics over an empty token set
    are 0; ``on_pg_clipfrac`` is over all valid tokens (as LUFFY); ``off_pg_loss`` is before ``c``.
    """
    log_prob, old_log_prob, advantages = inputs.log_prob, inputs.old_log_prob, inputs.advantages
    if inputs.prefix_mask is None:
        raise ValueError("the luffy_token loss needs prefix_mask (the off-policy tokens)")
    prefix = inputs.prefix_mask.bool()
    valid = inputs.response_mask.to(log_prob.dtype)
    off_tokens = prefix.to(log_prob.dtype) * valid
    on_tokens = (~prefix).to(log_prob.dtype) * valid
    prob = torch.exp(log_prob)

    log_ratio = log_prob - old_log_prob
    ppo_kl = verl_F.masked_mean_or_zero(-log_ratio, valid)
    ratio = on_policy_ratio(
        log_prob, old_log_prob, cfg.on_policy_reshape, cfg.on_policy_reshape_weight, cfg.on_policy_reshape_pow_exp
    )
    on_pg_losses, on_pg_clipfrac = clipped_pg_losses(
        advantages, ratio, valid, cfg.clip_ratio, cfg.clip_upper_bound, cfg.loss_remove_clip
    )
    if inputs.rollout_is_weights is not None:  # rollout correction: on-policy tokens only (prefix tokens: shaping)
        on_pg_losses = on_pg_losses * inputs.rollout_is_weights
    on_pg_loss = verl_F.masked_mean_or_zero(on_pg_losses, on_tokens)

    shaped = off_policy_weight(
        log_prob, cfg.off_policy_reshape, cfg.off_policy_reshape_weight, cfg.off_policy_reshape_pow_exp
    )
    behaviour = inputs.behaviour_log_probs
    if behaviour is None:
        off_ratio = shaped
    else:
        if behaviour.shape != log_prob.shape:
            raise ValueError(
                f"behaviour probs shape {tuple(behaviour.shape)} != log_prob shape {tuple(log_prob.shape)}"
            )
        behaviour_probs = behaviour.exp().to(log_prob.dtype)
        # NaN = behaviour unknown (e.g. a dataset target next to self-replayed traces): the configured shaping.
        unknown = torch.isnan(behaviour_probs)
        importance = prob / (torch.where(unknown, torch.ones_like(behaviour_probs), behaviour_probs) + 1e-6)
        off_ratio = torch.where(unknown, shaped, importance) * prefix.to(log_prob.dtype)
    zero = torch.zeros((), device=log_prob.device)
    off_ratio_max_clip_frac = off_ratio_min_clip_frac = zero
    off_max_clip, off_min_clip = clamp_bound(cfg.off_policy_max_clip), clamp_bound(cfg.off_policy_min_clip)
    if off_max_clip is not None:
        off_ratio = torch.clamp(off_ratio, max=off_max_clip)
        off_ratio_max_clip_frac = verl_F.masked_mean_or_zero((off_ratio == off_max_clip).float(), off_tokens)
    if off_min_clip is not None:
        off_ratio = torch.clamp(off_ratio, min=off_min_clip)
        off_ratio_min_clip_frac = verl_F.masked_mean_or_zero((off_ratio == off_min_clip).float(), off_tokens)
    off_pg_losses = -advantages * off_ratio
    off_pg_loss = verl_F.masked_mean_or_zero(off_pg_losses, off_tokens)

    # off_policy_loss_coef (not in LUFFY; 1.0 = LUFFY) weights the off-policy tokens' term against the on-policy
    # ones; skipped at 1.0 so LUFFY's graph is unchanged.
    off_term = off_pg_losses if cfg.off_policy_loss_coef == 1.0 else cfg.off_policy_loss_coef * off_pg_losses
    pg_losses = torch.where(prefix, off_term, on_pg_losses)
    loss_mask = valid
    all_max_clip = clamp_bound(cfg.all_max_clip)
    if all_max_clip is not None:
        loss_mask = valid * (prob <= all_max_clip).to(log_prob.dtype)
    pg_loss = aggregate_token_loss(pg_losses, loss_mask, cfg.loss_remove_token_mean)

    return pg_loss, {
        "off_pg_loss": off_pg_loss,
        "on_pg_loss": on_pg_loss,
        "on_pg_clipfrac": on_pg_clipfrac,
        "pg_clipfrac": on_pg_clipfrac,
        "ppo_kl": ppo_kl,
        "off_policy_prob": verl_F.masked_mean_or_zero(prob, off_tokens),
        "on_policy_prob": verl_F.masked_mean_or_zero(torch.exp(old_log_prob), on_tokens),
        "off_ratio_mean": verl_F.masked_mean_or_zero(off_ratio, off_tokens),
        "off_ratio_max_clip_frac": off_ratio_max_clip_frac,
        "off_ratio_min_clip_frac": off_ratio_min_clip_frac,
    }


def compute_sft_pure_loss(log_prob: torch.Tensor, eos_mask: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood token mean ``masked_mean(−ℓ, m)``; 0 when there is no valid token."""
    return verl_F.masked_mean_or_zero(-log_prob, eos_mask)


# The SFT term is over the off-policy rows, the PPO terms over the on-policy rows.
SFT_MULTITASK_METRIC_TOKENS = {
    "actor/sft_loss": "off_rows",
    "actor/on_pg_loss": "on_rows",
    "actor/pg_clipfrac": "on_rows",
    "actor/ppo_kl": "on_rows",
}


@register_policy_loss(
    "sft_multitask",
    auto_switch="use_sft_multitask_loss",
    metric_tokens=SFT_MULTITASK_METRIC_TOKENS,
    # the PPO term of the on-policy rows takes the IS weights; the off-policy rows' NLL reads no old log-prob
    supports_rollout_is=True,
    supports_bypass_mode=True,
)
def sft_multitask_loss(inputs: PolicyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """RL + SFT multi-task loss (``use_sft_multitask_loss``, docs/METHOD.md §1.9 "Other actor-side paths").

    Off-policy rows (any prefix token) contribute ``sft = masked_mean(−ℓ, m)`` over their valid tokens (0 if
    none); on-policy rows the PPO loss of :func:`~verl.trainer.ppo.core_algos.ppo_clip_loss` (its clip / width
    options apply); ``pg_loss = sft_loss_coef·sft + pg_on``. ``ppo_kl`` and ``pg_clipfrac`` are over the
    on-policy rows.
    """
    if inputs.prefix_mask is None:
        raise ValueError("the sft_multitask loss needs prefix_mask (the off-policy rows)")
    off_rows = inputs.prefix_mask.bool().any(dim=-1)
    on_rows = ~off_rows
    sft_loss = compute_sft_pure_loss(inputs.log_prob[off_rows], inputs.response_mask[off_rows])
    on_pg_loss, on = ppo_clip_loss(
        PolicyLossInputs(
            log_prob=inputs.log_prob[on_rows],
            old_log_prob=inputs.old_log_prob[on_rows],
            advantages=inputs.advantages[on_rows],
            response_mask=inputs.response_mask[on_rows],
            rollout_is_weights=None if inputs.rollout_is_weights is None else inputs.rollout_is_weights[on_rows],
        ),
        cfg,
    )
    return cfg.sft_loss_coef * sft_loss + on_pg_loss, {
        "sft_loss": sft_loss,
        "on_pg_loss": on_pg_loss,
        "pg_clipfrac": on["pg_clipfrac"],
        "ppo_kl": on["ppo_kl"],
    }


# ----------------------------------------------------------------------------------------------------
# Adaptive entropy coefficient
# ----------------------------------------------------------------------------------------------------
class AdaptiveEntropyCoeff:
    """Entropy coefficient α for ``policy_loss = pg_loss − α·H`` (``use_adaptive_temperature``).

    Learnable variant (SAC-style): ``α = exp(log α)``, clamped to ``≤ adaptive_temperature_clip`` when
    that is > 0, ``log α`` initialised to ``log(entropy_coeff)`` and trained by AdamW (lr ``alpha_lr``,
    betas (0.9, 0.999), weight decay 0.01) on ``alpha_loss = α·stopgrad(H − H_target)``: α shrinks while
    the entropy is above target and grows below it. ``fixed=True`` (``use_adaptive_temperature_fixed``):
    ``α = entropy_coeff·H_target/H``, no state.
    """

    def __init__(
        self,
        entropy_coeff: float,
        target_entropy: float,
        alpha_lr: float = 1e-2,
        clip: float = -1.0,
        fixed: bool = False,
    ):
        self.entropy_coeff = float(entropy_coeff)
        self.target_entropy = float(target_entropy)
        self.clip = float(clip)
        self.fixed = fixed
        self.log_alpha: torch.Tensor | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        if not fixed:
            if entropy_coeff <= 0:
                raise ValueError(
                    f"use_adaptive_temperature needs entropy_coeff > 0 to initialise log alpha, got {entropy_coeff}"
                )
            self.log_alpha = torch.tensor(math.log(entropy_coeff), dtype=torch.float32, requires_grad=True)
            self.optimizer = torch.optim.AdamW([self.log_alpha], lr=alpha_lr, betas=(0.9, 0.999), weight_decay=1e-2)

    def _alpha(self) -> torch.Tensor:
        alpha = self.log_alpha.exp()
        return torch.clamp(alpha, max=self.clip) if self.clip > 0 else alpha

    def coefficient(self, mean_entropy: torch.Tensor | float) -> float:
        """The α to multiply the entropy term with for a micro-batch of mean entropy ``H``."""
        if self.fixed:
            if float(mean_entropy) == 0.0:
                raise ValueError(
                    "use_adaptive_temperature_fixed: mean entropy is 0, entropy_coeff·target/H is undefined"
                )
            return self.entropy_coeff * self.target_entropy / float(mean_entropy)
        return float(self._alpha().detach())

    def accumulate(self, mean_entropy: torch.Tensor | float, grad_scale: float = 1.0) -> dict[str, float]:
        """Backpropagate ``grad_scale·α·(H − H_target)`` into ``log α`` (no-op for ``fixed``)."""
        if self.fixed:
            return {"actor/entropy_coeff": self.coefficient(mean_entropy)}
        alpha = self._alpha()
        gap = float(mean_entropy) - self.target_entropy
        alpha_loss = alpha * gap * grad_scale
        alpha_loss.backward()
        return {
            "actor/alpha_loss": float(alpha_loss.detach()),
            "actor/entropy_coeff": float(alpha.detach()),
            "actor/log_alpha": float(self.log_alpha.detach()),
        }

    def step(self) -> None:
        """Apply the accumulated ``log α`` gradient and clear it (call once per optimizer step)."""
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad()

    def update(self, mean_entropy: torch.Tensor | float) -> dict[str, float]:
        """One full update from a single entropy measurement: :meth:`accumulate` then :meth:`step`."""
        metrics = self.accumulate(mean_entropy)
        self.step()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state (empty for the fixed variant)."""
        if self.fixed:
            return {}
        return {"log_alpha": self.log_alpha.detach().clone(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if self.fixed:
            return
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.optimizer.load_state_dict(state["optimizer"])
