"""``algorithm.method=rl_plus`` (arXiv 2508.00222, RL-PLUS): LUFFY's slot plan and token loss, with the
demonstration's tokens weighted by multiple importance sampling against a mixture behaviour policy and by an
exploration-based advantage; its pure blocks first, then the method's registration.

Blocks: mirror YihongDong/RL-PLUS (commit eb4aa4d4), ``rl_plus/verl/verl/recipe/rlplus_core_alg.py``
``compute_token_on_off_policy_loss`` (lines 69-212), its ``off_policy_strategy == "RL-PLUS"`` branches (lines
135-137: the ratio; 164-167: the advantage) -> :func:`mixture_behaviour_prob`, :func:`mis_ratio`,
:func:`exploration_weight`, :func:`rl_plus_token_loss`. Everything else of RL-PLUS is LUFFY's, unchanged: their
fork's actor, trainer and rollout are ElliottYan/LUFFY's ``mix_src`` files renamed (``rlplus_actor.py``
``update_policy`` lines 144-236: the same loss call, entropy bonus and gradient accumulation), and their script
``exp_scripts/train_RL-PLUS.sh`` is LUFFY's ``train.sh`` with ``off_policy_reshape=p_div_p_0.1`` replaced by
``off_policy_strategy=RL-PLUS``. So the loss here is LUFFY's block itself (``luffy_token_loss``,
luffy_pool/algorithm/mix_core_alg.py) given the mixture as its behaviour policy and the weighted advantages.

On a demonstration token (``prefix_mask``), with ``p = exp ℓ`` and ``q = exp ℓ_old`` (the actor's recomputed
log-prob of the demonstration), their code builds ``ω = ½(q + e)`` (``e`` the expert's probability, taken as 1)
and the ratio ``r = 2p/(q + ω)``, i.e. the behaviour policy ``b = ½(q + ω) = (3q + e)/4``: the mixture is applied
twice, so ``r = 4p/(3q + 1)``, not the paper's ``2p/(q + 1)`` (quirk kept: at ``p = q = 0.5``, r = 0.8). The
token's loss is ``−r·A·sg[(1 − p)]^γ`` (γ = ½): the exploration weight is 0 for a token the model is sure of
(``p = 1``). No clip of ``r`` (``off_policy_max_clip = -1``). On-policy tokens: ``−A·exp(ℓ − ℓ_old)``,
unclipped in their script (``loss_remove_clip=True``); aggregation ``Σ/L`` (``loss_remove_token_mean=True``).
The advantage is the script's ``grpo`` without std over all n rows of the group, the demonstration row included.

LUFFY's block divides ``p`` by ``π_b + 1e-6``; their RL-PLUS ratio has no ε, so the behaviour passed to it is
``b − 1e-6`` (``b ≥ e/4``, hence ``e ≥ 0.001``). Differences kept visible: ``on_pg_loss`` over a micro-batch
without on-policy tokens is 0 (theirs NaN); ``on_pg_clipfrac`` (PPO clip on only) counts a demonstration token
with ``p = 1`` as unclipped (its weighted advantage is 0). Knobs: :class:`RlPlusKnobs`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from luffy_pool.algorithm.mix_core_alg import LUFFY_TOKEN_METRIC_TOKENS, luffy_token_loss
from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.loss_inputs import FamilyLossInputs
from luffy_pool.methods.base import registry_entry
from verl.trainer.ppo.core_algos import register_policy_loss
from verl.utils import torch_functional as verl_F
from verl.utils.config_section import NON_NEGATIVE, Bound, key

# the ε LUFFY's off-policy block adds to the behaviour probability (mix_core_alg.luffy_token_loss: p / (π_b + 1e-6))
LUFFY_BEHAVIOUR_EPS = 1e-6
EXPERT_PROB = Bound(lambda v: 1e-3 <= v <= 1.0, "must be in [0.001, 1]")


def mixture_behaviour_prob(old_prob: torch.Tensor, expert_prob: float = 1.0) -> torch.Tensor:
    """The behaviour probability of their ratio: ``b = ½(q + ω)`` with ``ω = ½(q + e)``, i.e. ``(3q + e)/4``."""
    omega = 0.5 * (old_prob + expert_prob)
    return 0.5 * (old_prob + omega)


def mis_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, expert_prob: float = 1.0) -> torch.Tensor:
    """Their multiple-importance-sampling ratio ``r = p / b = 4p/(3q + e)`` (``p = exp ℓ``, ``q = exp ℓ_old``)."""
    return torch.exp(log_prob) / mixture_behaviour_prob(torch.exp(old_log_prob), expert_prob)


def exploration_weight(log_prob: torch.Tensor, gamma: float = 0.5) -> torch.Tensor:
    """The exploration-based advantage weight ``sg[(1 − p)]^γ``: large where the model finds the token unlikely."""
    return (1 - torch.exp(log_prob.detach())) ** gamma


def rl_plus_token_loss(
    inputs: FamilyLossInputs, cfg, explore_gamma: float = 0.5, expert_prob: float = 1.0
) -> tuple[torch.Tensor, dict]:
    """RL-PLUS's micro-batch loss: LUFFY's token loss (``cfg``: the actor's loss section: its on-policy clip,
    off-policy clamps and aggregation) with the mixture ``b`` (:func:`mixture_behaviour_prob`) as the behaviour
    policy of the demonstration tokens and their advantages times :func:`exploration_weight`. Metrics: LUFFY's,
    plus ``rl_plus/explore_weight`` and ``rl_plus/behaviour_prob``, means over the valid demonstration tokens."""
    if inputs.prefix_mask is None:
        raise ValueError("the rl_plus loss needs inputs.prefix_mask (the demonstration tokens)")
    if inputs.behaviour_log_probs is not None:
        raise ValueError(
            "the rl_plus loss builds the demonstration's behaviour policy from the old log-probs; recorded "
            "behaviour probabilities (actor.use_off_policy_probs) are not read by it"
        )
    prefix = inputs.prefix_mask.bool()
    behaviour = mixture_behaviour_prob(torch.exp(inputs.old_log_prob), expert_prob)
    weight = exploration_weight(inputs.log_prob, explore_gamma)
    weighted = dataclasses.replace(
        inputs,
        advantages=torch.where(prefix, inputs.advantages * weight, inputs.advantages),
        behaviour_log_probs=torch.log(behaviour - LUFFY_BEHAVIOUR_EPS),
    )
    loss, metrics = luffy_token_loss(weighted, cfg)
    demo_tokens = prefix.to(inputs.log_prob.dtype) * inputs.response_mask
    metrics["rl_plus/explore_weight"] = verl_F.masked_mean_or_zero(weight, demo_tokens)
    metrics["rl_plus/behaviour_prob"] = verl_F.masked_mean_or_zero(behaviour, demo_tokens)
    return loss, metrics


@dataclass(frozen=True)
class RlPlusKnobs:
    """``algorithm.rl_plus``: the two constants of the RL-PLUS branch (hard-coded in the authors' code)."""

    explore_gamma: float = key(
        bounds=NON_NEGATIVE,
        default=0.5,
        doc="Exponent g of the exploration weight sg[(1-p)]^g on the demonstration tokens' advantage. Authors: 0.5 "
        "(rlplus_core_alg.py line 166).",
    )
    mis_expert_prob: float = key(
        bounds=EXPERT_PROB,
        default=1.0,
        doc="Probability e the expert is assumed to give its own tokens in the mixture behaviour policy "
        "b = (q + (q + e)/2)/2, ratio 4p/(3q + e). Authors: 1 (rlplus_core_alg.py line 136).",
    )


def rl_plus_loss(inputs: FamilyLossInputs, knobs: RlPlusKnobs, step: int):
    """:func:`rl_plus_token_loss` with the actor's loss keys and the method's knobs."""
    return rl_plus_token_loss(
        inputs, inputs.settings, explore_gamma=knobs.explore_gamma, expert_prob=knobs.mis_expert_prob
    )


_METHOD = Method(
    name="rl_plus",
    mechanism="LUFFY's slots; demonstration tokens weighted by 4p/(3q+1) (mixture behaviour) and (1-p)^0.5",
    knobs=RlPlusKnobs,
    loss=rl_plus_loss,
    needs_demonstration=True,
)
# The loss's registry entry (register_method's own), registered first with the token sets of LUFFY's metrics (its
# off_* metrics over the demonstration tokens, on_* over the others), so actor.metric_aggregation=token_weighted
# averages them as LUFFY's; register_method then finds the entry in place.
register_policy_loss(
    _METHOD.name,
    metric_tokens={
        **LUFFY_TOKEN_METRIC_TOKENS,
        "actor/rl_plus/explore_weight": "off",
        "actor/rl_plus/behaviour_prob": "off",
    },
)(registry_entry(_METHOD))
RL_PLUS = register_method(_METHOD)
