"""``algorithm.method=srft`` (arXiv 2506.19767) as implemented by the HPT authors' baseline: one loss of
entropy-weighted SFT on the demonstration (``0.5·e^{−H}``), LUFFY's shaped off-policy term on it, and
sign-weighted on-policy terms (``0.1·e^{H}`` on correct rollouts, −1 on the others). Its pure blocks first, then
the method's wiring.

Blocks: mirror TsinghuaC3I/Unify-Post-Training (commit ae332f5f), ``hpt/verl/verl/mix_src/``: the
``offline_loss_type == "srft"`` branch of ``mix_actor.py`` ``update_policy`` (entropy coefficients, weighted
``compute_sft_pure_loss``) and ``mix_core_alg.py`` ``compute_token_on_off_policy_srft_loss`` -> :func:`srft_loss`
(:func:`srft_coefficients`, :func:`srft_token_loss`). No official SRFT code was found. Quirks kept: ``H_i`` is row
i's mean token entropy (detached) over its response mask; the demo's SFT term is
``mean_{demo tokens}(−0.5·e^{−H_i}·ℓ_t)``, NaN-skipped; on rows use ``a_i = 0.1·e^{H_i}`` if their score sums to
exactly 1 else ``−1`` times ``ℓ_t`` (``srft_type=paper``; ``exp``: p_t, ``classic_rl``: ρ_t, ``minus_old``:
ℓ_t − ℓ_old) and ignore the GRPO advantage; the off-policy term ``−A·p_t/(p_t+γ)`` uses the behaviour policy 1;
``sft_loss_coef`` is not applied; with ``loss_remove_clip=False`` the "clip" clamps ``ℓ_t`` itself into
``[1−ε, max(clip_upper_bound, 1+ε)]`` (meaningless; kept for fidelity, off in the script).

Wiring: LUFFY's slot plan and advantage (one full demonstration row per group, Dr.GRPO over the whole group). The
driver adds ``row_scores`` (each row's sequence score) so the loss finds the correct rows (score exactly 1, as
theirs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from luffy_pool.methods.loss_helpers import aggregate, clipped_on_losses, masked_mean_plain, shape_off_ratio
from luffy_pool.methods.loss_inputs import FamilyLossInputs, require
from verl.utils.config_section import NON_NEGATIVE, key

SRFT_TYPES = ("paper", "exp", "classic_rl", "minus_old")


@dataclass(frozen=True)
class SrftConfig:
    """SRFT's knobs (``exp_scripts/train_srft.sh``: paper type, p_div_p_0.1, unclipped, sum / width)."""

    srft_type: str = "paper"
    sft_weight_scale: float = 0.5
    rl_pos_weight_scale: float = 0.1
    off_policy_reshape: str = "p_div_p_0.1"
    clip_ratio: float = 0.2
    clip_upper_bound: float = 1.0
    loss_remove_token_mean: bool = True
    loss_remove_clip: bool = True


def srft_coefficients(
    entropy: torch.Tensor, mask: torch.Tensor, cfg
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row ``(H, w_SFT = 0.5·e^{−H}, a_pos = 0.1·e^{H})`` from the token entropies (detached)."""
    h = masked_mean_plain(entropy, mask, axis=-1).detach()
    return h, cfg.sft_weight_scale * torch.exp(-1 * h), cfg.rl_pos_weight_scale * torch.exp(h)


def srft_token_loss(inputs: FamilyLossInputs, on_coef: torch.Tensor, correct: torch.Tensor, cfg) -> dict:
    """Their ``compute_token_on_off_policy_srft_loss`` for the options the SRFT script uses."""
    if cfg.srft_type not in SRFT_TYPES:
        raise ValueError(f"unknown srft_type {cfg.srft_type!r}; valid: {list(SRFT_TYPES)}")
    log_prob, old_log_prob = inputs.log_prob, inputs.old_log_prob
    adv, eos_mask = inputs.advantages, inputs.response_mask
    prefix = inputs.prefix_mask.bool()
    log_ratio = log_prob - old_log_prob
    ppo_kl = masked_mean_plain(-log_ratio, eos_mask)
    ratio = torch.exp(log_ratio)
    on_adv = torch.where(
        correct.unsqueeze(-1).expand_as(adv),
        on_coef.view(-1, 1).expand_as(adv),
        torch.tensor(-1.0, device=adv.device, dtype=adv.dtype).expand_as(adv),
    )
    base = {"exp": torch.exp(log_prob), "classic_rl": ratio, "minus_old": log_ratio}.get(cfg.srft_type, log_prob)
    # their "clip" clamps the log-prob itself (quirk kept; the script turns it off)
    on_losses, on_clipfrac = clipped_on_losses(on_adv, base, log_prob, eos_mask, cfg)
    on_pg_loss = masked_mean_plain(on_losses, (~prefix) * eos_mask)
    off_ratio = shape_off_ratio(torch.exp(log_prob), cfg.off_policy_reshape, "srft")
    off_losses = -adv * off_ratio
    off_pg_loss = masked_mean_plain(off_losses, prefix * eos_mask)
    prefix_f = prefix.float()
    pg_losses = off_losses * prefix_f + on_losses * (1 - prefix_f)
    pg_loss = aggregate(pg_losses, eos_mask, cfg.loss_remove_token_mean)
    zero = torch.tensor(0.0)
    return {
        "pg_loss": pg_loss,
        "off_pg_loss": zero if torch.isnan(off_pg_loss) else off_pg_loss.detach(),
        "on_pg_loss": on_pg_loss.detach(),
        "on_pg_clipfrac": on_clipfrac,
        "ppo_kl": ppo_kl.detach(),
    }


def srft_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """SRFT's micro-batch loss ``SFT_w + pg`` (entropy bonus excluded: the actor's). Needs ``entropy``
    (token entropies) and ``correct_mask`` (rows whose score sums to exactly 1); demo rows are those with a
    ``prefix_mask`` token."""
    entropy = require(inputs, "entropy", "srft")
    correct = require(inputs, "correct_mask", "srft").bool()
    if inputs.prefix_mask is None:
        raise ValueError("the srft loss needs inputs.prefix_mask (the demonstration rows)")
    h, sft_coef, on_coef = srft_coefficients(entropy, inputs.response_mask, cfg)
    demo = inputs.prefix_mask.bool().any(-1)
    weighted = (inputs.log_prob * sft_coef.view(-1, 1))[demo]
    sft = masked_mean_plain(-weighted, inputs.response_mask[demo])
    ret = srft_token_loss(inputs, on_coef, correct, cfg)
    loss = ret["pg_loss"] if torch.isnan(sft) else sft + ret["pg_loss"]
    metrics = {k: v for k, v in ret.items() if k != "pg_loss"}
    metrics.update(
        {"sft_loss": sft.detach(), "srft/H": h.mean(), "srft/sft_coef": sft_coef.mean(), "srft/on_coef": on_coef.mean()}
    )
    return loss, metrics


@dataclass(frozen=True)
class SrftKnobs:
    """``algorithm.srft``: SRFT's entropy weights."""

    srft_type: str = key(
        choices=SRFT_TYPES,
        default='paper',
        doc="On-policy term: paper (-a·logp), exp (p), classic_rl (ratio), minus_old (logp - old logp). Authors: paper.",
    )
    sft_weight_scale: float = key(
        bounds=NON_NEGATIVE,
        default=0.5,
        doc="Demonstration SFT weight scale s: w = s·exp(-H) with H the row's mean token entropy. Authors: 0.5.",
    )
    rl_pos_weight_scale: float = key(
        bounds=NON_NEGATIVE,
        default=0.1,
        doc="Weight scale of correct rollouts: a = s·exp(H) (incorrect ones get -1). Authors: 0.1.",
    )


def srft_method_loss(inputs: FamilyLossInputs, knobs: SrftKnobs, step: int):
    """:func:`srft_loss` with the actor's loss keys (off-policy reshape, clip and aggregation)."""
    loss = inputs.settings
    cfg = SrftConfig(
        srft_type=knobs.srft_type,
        sft_weight_scale=knobs.sft_weight_scale,
        rl_pos_weight_scale=knobs.rl_pos_weight_scale,
        off_policy_reshape=loss.off_policy_reshape,
        clip_ratio=loss.clip_ratio,
        clip_upper_bound=loss.clip_upper_bound,
        loss_remove_token_mean=loss.loss_remove_token_mean,
        loss_remove_clip=loss.loss_remove_clip,
    )
    return srft_loss(inputs, cfg)


def row_scores(batch, sections) -> dict:
    """``batch.batch["row_scores"]``: the sequence score of each row; metric ``srft/correct_fraction``."""
    scores = batch.batch["token_level_scores"].sum(-1)
    batch.batch["row_scores"] = scores
    return {"srft/correct_fraction": float((scores == 1.0).float().mean())}


class SrftHooks(StepHooks):
    """The rows' scores, after the advantage and before the update (the loss's sign rule reads them)."""

    name = "srft"

    def __init__(self, context):
        self.sections = context.sections

    def before_update(self, batch):
        return row_scores(batch, self.sections), {}


SRFT = register_method(
    Method(
        name="srft",
        mechanism="entropy-weighted SFT + shaped off-policy PG on the demo + sign-weighted on-policy PG",
        knobs=SrftKnobs,
        loss=srft_method_loss,
        hooks=SrftHooks,
        needs_demonstration=True,
        batch_keys=("row_scores",),
    )
)
