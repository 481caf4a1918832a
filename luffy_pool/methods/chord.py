"""``algorithm.method=chord`` (arXiv 2508.11408, Trinity-RFT's ``mix_chord``): the loss
``(1 − μ(t))·L_GRPO + μ(t)·L_SFT`` with a step-scheduled global SFT weight μ and per-token φ(p) = p(1 − p) SFT
weights; its pure blocks first, then the method's registration.

Blocks: mirror modelscope/Trinity-RFT ``trinity/algorithm/policy_loss_fn/chord_policy_loss.py`` (commit b458e2c2):
``mu_schedule_function`` -> :func:`mu_schedule`, ``phi_function`` -> :func:`phi`, ``SFTPhiLossFn`` ->
:func:`sft_phi_loss`, ``SFTISLossFn`` -> :func:`sft_is_loss`, ``SFTLossFn`` (``sft_loss.py``) ->
:func:`sft_plain_loss`, ``MIXCHORDPolicyLossFn`` -> :func:`chord_mixed_loss`; its GRPO part is Trinity's
``PPOPolicyLossFn`` (``ppo_policy_loss.py``, the dual-clip version with ``clip_ratio_c=3`` and the log-ratio
clamped to ±20) -> :func:`dual_clip_ppo_loss`. Quirks kept (they change numbers): every mean is Trinity's
``Σv·m/(Σm + 1e-8)``; each term is scaled by ``(#rows of its type in the micro-batch) × w_type`` with
``w_type = (ppo_mini_batch_size/ngpus) / (rows_in_micro_batch × train_batch_size_type/ngpus)`` under dynamic
batch size, else ``(ppo_mini_batch_size/ppo_micro_batch_size_per_gpu) / (train_batch_size_type/ngpus)`` (integer
divisions as in Trinity); the mixed loss builds its φ-SFT term without ``cutoff_prob`` (always 1.0 there, as in
Trinity). μ is a Python float of the step only, so it carries no state beyond the global step.

Wiring: the expert rows are the groups' full demonstration rows (LUFFY's slot plan, one per group, so the expert
share is ``1/n``: 1/8 with n = 8, Trinity's example uses 0.2 of the batch from a separate SFT set). The advantage
is ``grpo_split``, so the GRPO groups hold the on-policy rows only, as Trinity's. The step ``t`` the schedule reads
is the trainer's ``global_steps − 1`` (0 on the first update, so CHORD-μ starts at its peak), the update's
argument (luffy_pool/methods/losses.py). Knobs: :class:`ChordKnobs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.loss_helpers import masked_mean_eps
from luffy_pool.methods.loss_inputs import FamilyLossInputs, require
from verl.utils.config_section import NON_NEGATIVE, POSITIVE, UNIT, key


@dataclass(frozen=True)
class ChordConfig:
    """Knobs of CHORD's blocks, named as Trinity's ``MIXCHORDPolicyLossFn`` arguments (its defaults;
    the CHORD-μ / CHORD-φ settings are in the comments of Trinity-RFT's examples/mix_chord/mix_chord.yaml, commit
    04143305)."""

    mu_warmup_steps: int = 0
    mu_decay_steps: int = 0
    mu_peak: float = 0.1
    mu_valley: float = 0.1
    enable_phi_function: bool = True
    clip_range: float = 0.2
    clip_ratio_c: float = 3.0
    use_dynamic_bsz: bool = False
    ppo_mini_batch_size: int = 1
    ppo_micro_batch_size_per_gpu: int = 1
    ngpus_trainer: int = 1
    train_batch_size_usual: int = 1
    train_batch_size_expert: int = 1
    use_token_level_loss_in_sft: bool = True
    cutoff_prob: float = 1.0  # only read by the standalone sft_phi loss, as in Trinity


def mu_schedule(step: int, cfg) -> float:
    """μ(t): linear warm-up ``μ_peak·t/W`` for ``t < W``; ``μ_valley`` for ``t ≥ W + D``; in between the cosine
    ``μ_valley + (μ_peak − μ_valley)·½(1 + cos(π(t − W)/D))``."""
    warmup, decay = cfg.mu_warmup_steps, cfg.mu_decay_steps
    if step < warmup:
        return (step / warmup) * cfg.mu_peak
    if step >= warmup + decay:
        return cfg.mu_valley
    cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup) / decay))
    return (cfg.mu_peak - cfg.mu_valley) * cosine + cfg.mu_valley


def phi(token_prob: torch.Tensor) -> torch.Tensor:
    """φ(p) = p(1 − p): small for tokens the policy finds near-certain or near-impossible."""
    return token_prob * (1 - token_prob)


def _sft_aggregate(token_losses: torch.Tensor, mask: torch.Tensor, token_level: bool) -> torch.Tensor:
    """Token mean over the batch, or (``token_level`` False) the mean over rows of per-row token means."""
    if token_level:
        return masked_mean_eps(token_losses, mask)
    return masked_mean_eps(token_losses, mask, axis=-1).mean()


def sft_phi_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """CHORD-φ SFT: ``mean(−ℓ_t · sg[φ(p_t)])`` over ``response_mask``; with ``cutoff_prob < 1`` the ℓ in the
    product is clamped to ``≤ log(cutoff_prob)`` (φ still uses the unclamped p)."""
    if not 0.0 <= cfg.cutoff_prob <= 1.0:
        raise ValueError(f"cutoff_prob must be in [0, 1], got {cfg.cutoff_prob}")
    log_prob = inputs.log_prob
    weight = phi(torch.exp(log_prob)).detach()
    if cfg.cutoff_prob < 1.0:
        log_prob = torch.clamp(log_prob, max=math.log(cfg.cutoff_prob))
    loss = _sft_aggregate(-log_prob * weight, inputs.response_mask, cfg.use_token_level_loss_in_sft)
    return loss, {"sft_phi_loss": loss.detach()}


def sft_is_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """SFT with importance weight: ``mean(−ℓ_t · sg[p_t])``."""
    weight = torch.exp(inputs.log_prob).detach()
    loss = _sft_aggregate(-inputs.log_prob * weight, inputs.response_mask, cfg.use_token_level_loss_in_sft)
    return loss, {"sft_is_loss": loss.detach()}


def sft_plain_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """Plain NLL ``mean(−ℓ_t)`` (CHORD-μ, φ off)."""
    loss = _sft_aggregate(-inputs.log_prob, inputs.response_mask, cfg.use_token_level_loss_in_sft)
    return loss, {"sft_loss": loss.detach()}


def dual_clip_ppo_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """Trinity's PPO loss: ``d = clamp(ℓ − ℓ_old, ±20)``, ``ρ = e^d``, ``L1 = max(−Aρ, −A·clip(ρ, 1−ε, 1+ε))``;
    where ``A < 0`` the dual clip ``min(L1, −A·c)`` (``c = clip_ratio_c``); token mean over ``response_mask``."""
    if cfg.clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {cfg.clip_ratio_c}")
    mask, adv = inputs.response_mask, inputs.advantages
    log_ratio = torch.clamp(inputs.log_prob - inputs.old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean_eps(-log_ratio, mask)
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1.0 - cfg.clip_range, 1.0 + cfg.clip_range)
    clipped1 = torch.maximum(losses1, losses2)
    clipfrac = masked_mean_eps(torch.gt(losses2, losses1).float(), mask)
    losses3 = -adv * cfg.clip_ratio_c
    clipped2 = torch.min(losses3, clipped1)
    clipfrac_lower = masked_mean_eps(torch.gt(clipped1, losses3) * (adv < 0).float(), mask)
    pg_losses = torch.where(adv < 0, clipped2, clipped1)
    loss = masked_mean_eps(pg_losses, mask)
    return loss, {
        "pg_clipfrac": clipfrac.detach(),
        "ppo_kl": ppo_kl.detach(),
        "pg_loss": loss.detach(),
        "pg_clipfrac_lower": clipfrac_lower.detach(),
    }


def _per_micro_batch_weights(rows: int, cfg) -> tuple[float, float]:
    """(w_usual, w_expert): the factor that makes each term a per-sample mean of its type over the step."""
    experience_per_gpu = cfg.ppo_mini_batch_size // cfg.ngpus_trainer
    gradient_accumulation = cfg.ppo_mini_batch_size // cfg.ppo_micro_batch_size_per_gpu
    usual = cfg.train_batch_size_usual // cfg.ngpus_trainer
    expert = cfg.train_batch_size_expert // cfg.ngpus_trainer
    if cfg.use_dynamic_bsz:
        return experience_per_gpu / (rows * usual), experience_per_gpu / (rows * expert)
    return gradient_accumulation / usual, gradient_accumulation / expert


def chord_mixed_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """CHORD's loss ``(1 − μ(t))·n_u·w_u·L_GRPO(usual rows) + μ(t)·n_e·w_e·L_SFT(expert rows)``.

    ``inputs.expert_mask`` ``[rows]`` marks the expert (SFT) rows, ``inputs.step`` is the global step; L_GRPO
    is :func:`dual_clip_ppo_loss`, L_SFT :func:`sft_phi_loss` (``enable_phi_function``, cutoff 1.0) or
    :func:`sft_plain_loss`; a term with no row is 0. ``w_*`` see :func:`_per_micro_batch_weights`. Metrics:
    ``usual/*`` and ``expert/*`` scaled like their terms, ``loss``, ``mu``.
    """
    expert = require(inputs, "expert_mask", "chord").bool()
    step = require(inputs, "step", "chord")
    if expert.shape[0] != inputs.log_prob.shape[0]:
        raise ValueError(f"expert_mask has {expert.shape[0]} rows, log_prob {inputs.log_prob.shape[0]}")
    n_usual, n_expert = int((~expert).sum()), int(expert.sum())
    w_usual, w_expert = _per_micro_batch_weights(inputs.log_prob.shape[0], cfg)
    device = inputs.log_prob.device
    metrics: dict = {}
    if n_usual > 0:
        usual = FamilyLossInputs(
            log_prob=inputs.log_prob[~expert],
            old_log_prob=inputs.old_log_prob[~expert],
            advantages=inputs.advantages[~expert],
            response_mask=inputs.response_mask[~expert],
        )
        grpo_loss, grpo_metrics = dual_clip_ppo_loss(usual, cfg)
        grpo_loss = grpo_loss * n_usual * w_usual
        metrics.update({f"usual/{k}": v * n_usual * w_usual for k, v in grpo_metrics.items()})
    else:
        grpo_loss = torch.tensor(0.0, device=device)
    if n_expert > 0:
        demo = FamilyLossInputs(
            log_prob=inputs.log_prob[expert],
            old_log_prob=inputs.old_log_prob[expert],
            advantages=inputs.advantages[expert],
            response_mask=inputs.response_mask[expert],
        )
        # Trinity builds the mixed loss's SFT term without cutoff_prob.
        sft_fn = sft_phi_loss if cfg.enable_phi_function else sft_plain_loss
        sft_cfg = _NoCutoff(cfg)
        sft_loss, sft_metrics = sft_fn(demo, sft_cfg)
        sft_loss = sft_loss * n_expert * w_expert
        metrics.update({f"expert/{k}": v * n_expert * w_expert for k, v in sft_metrics.items()})
    else:
        sft_loss = torch.tensor(0.0, device=device)
    mu = mu_schedule(step, cfg)
    loss = (1 - mu) * grpo_loss + mu * sft_loss
    metrics.update({"loss": loss.detach(), "mu": mu})
    return loss, metrics


class _NoCutoff:
    """``cfg`` seen with ``cutoff_prob = 1.0`` (the mixed loss's SFT term ignores the knob, as Trinity's)."""

    def __init__(self, cfg):
        self._cfg = cfg

    def __getattr__(self, name):
        return 1.0 if name == "cutoff_prob" else getattr(self._cfg, name)


@dataclass(frozen=True)
class ChordKnobs:
    """``algorithm.chord``: CHORD's μ schedule and SFT term."""

    mu_warmup_steps: int = key(
        bounds=NON_NEGATIVE,
        default=0,
        doc="mu(t) warm-up steps W (linear 0 -> mu_peak). CHORD-phi: 0; CHORD-mu: 0; the example YAML: 200.",
    )
    mu_decay_steps: int = key(
        bounds=NON_NEGATIVE,
        default=0,
        doc="mu(t) cosine decay steps D (mu_peak -> mu_valley). CHORD-phi: 0 (constant); CHORD-mu: 200; example: 400.",
    )
    mu_peak: float = key(
        bounds=UNIT, default=0.1, doc="Peak SFT weight mu. CHORD-phi: 0.1; CHORD-mu: 0.9; example: 0.5."
    )
    mu_valley: float = key(
        bounds=UNIT, default=0.1, doc="Final SFT weight mu. CHORD-phi: 0.1; CHORD-mu: 0.05; example: 0.02."
    )
    enable_phi_function: bool = key(
        default=True, doc="Token weight phi(p) = p(1-p) on the SFT term. CHORD-phi: True; CHORD-mu: False."
    )
    clip_ratio_c: float = key(
        bounds=POSITIVE,
        default=3.0,
        doc="Dual-clip bound c of the GRPO term (Trinity's PPO loss; the ratio clip is actor.clip_ratio). Trinity: 3.0.",
    )
    use_token_level_loss_in_sft: bool = key(
        default=True, doc="SFT term as a token mean over the micro-batch (False: mean of per-row means). Trinity: True."
    )


def chord_loss(inputs: FamilyLossInputs, knobs: ChordKnobs, step: int):
    """The mixed loss with Trinity's per-type weights for this rank's mini-batch (``expert_share`` of its rows
    are expert rows), so each term is the per-row mean of its type over the mini-batch. Our actor divides every
    micro-batch loss by ``gradient_accumulation``, with or without dynamic batch size, which is Trinity's
    fixed-size case (``use_dynamic_bsz=False``: ``w_type = gradient_accumulation / rows_of_type``)."""
    loss, sizes = inputs.settings, inputs.batch_sizes
    mini = sizes.ppo_mini_rows
    expert = max(1, round(mini * inputs.expert_share))
    cfg = ChordConfig(
        mu_warmup_steps=knobs.mu_warmup_steps,
        mu_decay_steps=knobs.mu_decay_steps,
        mu_peak=knobs.mu_peak,
        mu_valley=knobs.mu_valley,
        enable_phi_function=knobs.enable_phi_function,
        clip_range=loss.clip_ratio,
        clip_ratio_c=knobs.clip_ratio_c,
        use_dynamic_bsz=False,
        ppo_mini_batch_size=sizes.gradient_accumulation,
        ppo_micro_batch_size_per_gpu=1,
        ngpus_trainer=1,
        train_batch_size_usual=max(1, mini - expert),
        train_batch_size_expert=expert,
        use_token_level_loss_in_sft=knobs.use_token_level_loss_in_sft,
    )
    return chord_mixed_loss(inputs, cfg)


CHORD = register_method(
    Method(
        name="chord",
        mechanism="(1 − μ(t))·GRPO + μ(t)·φ-weighted SFT on expert rows, μ cosine-decayed",
        knobs=ChordKnobs,
        loss=chord_loss,
        needs_demonstration=True,
    )
)
