"""LUFFY's mixed advantage, post-processing, SFT losses, adaptive entropy coefficient and the rollout-correction
weights of its losses, pinned with hand-computed values (docs/METHOD.md §1.7, §1.9, §8 items 3-4). The token
on/off-policy loss is tests/luffy_pool/algorithm/test_mix_core_alg_token_loss.py.

The registered functions are called as ``fn(inputs, cfg)``: ``cfg`` is the actor's loss section of the YAML with
the knobs a test sets (YAML key names), or ``AdvantageConfig`` for the estimator. LUFFY's signatures are tested
against these in tests/verl/mix_src/test_mix_core_alg_aliases.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from luffy_pool.algorithm import mix_core_alg as mca
from luffy_pool.algorithm.mix_advantage import MixedAdvantageConfig, postprocess_advantage
from tests.helpers.sections import loss_section
from verl.trainer.ppo import core_algos as ca
from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs, PolicyLossInputs

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

LN = math.log


# ---------------------------------------------------------------- registration
def test_importing_mix_core_alg_registers_estimator_and_losses():
    assert ca.get_adv_estimator_fn("grpo_split") is mca.grpo_split_advantage
    assert ca.get_policy_loss_fn("luffy_token") is mca.luffy_token_loss
    assert ca.get_policy_loss_fn("sft_multitask") is mca.sft_multitask_loss
    assert ca.POLICY_LOSS_SWITCHES == {"luffy_token": "use_off_policy_loss", "sft_multitask": "use_sft_multitask_loss"}
    # what the actor and the checker read of them, declared at registration (verl names no LUFFY loss)
    from verl.utils.step_metrics import LOSS_METRIC_TOKENS

    assert LOSS_METRIC_TOKENS["luffy_token"] == mca.LUFFY_TOKEN_METRIC_TOKENS
    assert LOSS_METRIC_TOKENS["sft_multitask"] == mca.SFT_MULTITASK_METRIC_TOKENS
    assert {"vanilla", "luffy_token", "sft_multitask"} <= ca.ROLLOUT_IS_LOSSES
    assert {"vanilla", "luffy_token", "sft_multitask"} <= ca.BYPASS_LOSSES


# ---------------------------------------------------------------- grpo_split
def _group(scores, width=2):
    rewards = torch.zeros(len(scores), width)
    rewards[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return rewards, torch.ones(len(scores), width)


def _split(rewards, mask, index, on, use_std=True):
    """The registered ``grpo_split`` estimator (no post-processing)."""
    return ca.get_adv_estimator_fn("grpo_split")(
        AdvantageInputs(rewards, mask, index, on_policy_mask=on), AdvantageConfig(grpo_use_std=use_std)
    )


def test_grpo_split_statistics_exclude_off_policy_rows():
    # row 0 off-policy (score 1); on-policy rows score 1, 0, 0: mu_on = 1/3
    rewards, mask = _group([1, 1, 0, 0])
    on = torch.tensor([False, True, True, True])
    adv, returns = _split(rewards, mask, ["u"] * 4, on, use_std=False)
    assert torch.allclose(adv[:, 0], torch.tensor([2 / 3, 2 / 3, -1 / 3, -1 / 3]))
    assert torch.equal(adv, returns)  # exact: returns are the advantage tensor itself
    # with std: unbiased sigma_on = sqrt((4/9 + 1/9 + 1/9)/2) = sqrt(1/3) = 0.577350
    adv, _ = _split(rewards, mask, ["u"] * 4, on, use_std=True)
    assert torch.allclose(adv[:, 0], torch.tensor([1.154700, 1.154700, -0.577350, -0.577350]), atol=1e-5)


def test_grpo_split_zero_std_becomes_one_and_off_rows_get_score_minus_mean():
    # on-policy rows all 0 -> mu 0, sigma 0 -> 1; off row: (1 - 0)/(1 + 1e-6)
    rewards, mask = _group([1, 0, 0, 0])
    on = torch.tensor([False, True, True, True])
    adv, _ = _split(rewards, mask, ["u"] * 4, on)
    assert torch.allclose(adv[:, 0], torch.tensor([1 / (1 + 1e-6), 0.0, 0.0, 0.0]))


def test_grpo_split_single_on_policy_row_uses_mean_zero_std_one():
    rewards, mask = _group([1.0, 0.5])
    adv, _ = _split(rewards, mask, ["u", "u"], torch.tensor([False, True]), use_std=False)
    assert torch.allclose(adv[:, 0], torch.tensor([1.0, 0.5]))


def test_grpo_split_equals_grpo_when_every_row_is_on_policy():
    rewards, mask = _group([1, 0, 1, 1, 0, 0])
    index = ["a", "a", "a", "b", "b", "b"]
    split, _ = _split(rewards, mask, index, torch.ones(6, dtype=torch.bool))
    plain, _ = ca.get_adv_estimator_fn("grpo")(AdvantageInputs(rewards, mask, index), AdvantageConfig())
    assert torch.allclose(split, plain)


def test_grpo_split_group_without_on_policy_row_is_an_error():
    rewards, mask = _group([1, 0])
    with pytest.raises(ValueError, match="group 'lonely' has no row"):
        _split(rewards, mask, ["lonely"] * 2, torch.tensor([False, False]))


# ---------------------------------------------------------------- advantage post-processing
def _finish(
    adv, prefix, alpha=1.0, beta=1.0, truncation=False, sft_prefix_advantage=None, responses=None, eos_token_id=2
):
    """LUFFY's post-processing, the driver's stage after any estimator (``mix_advantage.postprocess_advantage``)."""
    mixed = MixedAdvantageConfig(
        prefix_reward_weight_alpha=alpha,
        prefix_reward_weight_beta=beta,
        disable_truncation_advantage=truncation,
        sft_prefix_advantage=sft_prefix_advantage,
    )
    return postprocess_advantage(
        adv, torch.ones_like(adv), prefix, mixed, responses=responses, pad_token_id=0, eos_token_id=eos_token_id
    )


def test_prefix_reward_weights_scale_prefix_and_non_prefix_tokens():
    adv = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    prefix = torch.tensor([[True, False], [False, False]])
    # alpha 0.5 on prefix tokens, beta 2 elsewhere
    out = _finish(adv, prefix, alpha=0.5, beta=2.0)
    assert torch.equal(out, torch.tensor([[0.5, 2.0], [4.0, 4.0]]))  # exact: products of exact constants


def test_truncated_rows_without_eos_get_zero_advantage():
    adv = torch.ones(3, 3)
    responses = torch.tensor([[5, 6, 7], [5, 2, 0], [5, 6, 0]])
    no_prefix = torch.zeros(3, 3, dtype=torch.bool)
    # row 0: 3 non-pad tokens (= max length) and no EOS -> zeroed; row 1 has EOS; row 2 is short
    out = _finish(adv, no_prefix, truncation=True, responses=responses)
    # exact: ones times unit weights and a 0/1 fill (order-free)
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]))
    # with 7 also an EOS id, row 0 ended properly
    out = _finish(adv, no_prefix, truncation=True, responses=responses, eos_token_id=[2, 7])
    assert torch.equal(out, torch.ones(3, 3))


def test_sft_prefix_reward_sets_prefix_tokens_to_weight_over_n():
    adv = torch.tensor([[-0.5, -0.5, -0.5]])
    # sft_prefix_reward_weight 1.0 over n = 8 responses
    out = _finish(adv, torch.tensor([[True, True, False]]), sft_prefix_advantage=1.0 / 8)
    assert torch.equal(out, torch.tensor([[0.125, 0.125, -0.5]]))  # exact: a fill and products of exact constants


def test_the_estimators_return_verls_advantage_and_the_neutral_post_processing_only_masks():
    rewards, mask = torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, returns = ca.get_adv_estimator_fn("grpo_split")(
        AdvantageInputs(rewards, mask, ["u", "u"], on_policy_mask=torch.tensor([True, True])), AdvantageConfig()
    )
    plain, _ = ca.get_adv_estimator_fn("grpo")(AdvantageInputs(rewards, mask, ["u", "u"]), AdvantageConfig())
    assert torch.equal(adv, plain) and returns is adv  # no post-processing inside an estimator
    # alpha = beta = 1, no truncation, no SFT prefix advantage: the advantage times the response mask
    out = postprocess_advantage(adv, mask, torch.tensor([[True, False], [False, False]]), _neutral())
    assert torch.equal(out, adv * mask)


def _neutral():
    return MixedAdvantageConfig(1.0, 1.0, False, None)


# ---------------------------------------------------------------- SFT losses
def _sft_batch():
    # row 0 off-policy (prefix on its first token): l = ln .5, ln .25, pad
    # row 1 on-policy: l = ln .6 vs old ln .5 -> rho = 1.2, A = 1
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.6, 0.6, 0.9]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.1, 0.1, 0.1], [0.5, 0.5, 0.5]]))
    adv = torch.tensor([[7.0, 7.0, 7.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    prefix = torch.tensor([[True, False, False], [False, False, False]])
    return old, lp, adv, mask, prefix


def test_sft_pure_loss_is_token_mean_nll():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    # (ln 2 + ln 4)/2 = 1.039721
    assert mca.compute_sft_pure_loss(lp, torch.tensor([[1.0, 1.0, 0.0]])).item() == pytest.approx(1.0397208)
    assert mca.compute_sft_pure_loss(lp[:0], torch.ones(0, 3)).item() == 0.0  # exact: no token, the constant 0


def _sft_multitask(old, lp, adv, mask, prefix, **knobs):
    """``sft_multitask`` on these tensors -> ``{pg_loss, **metrics}``."""
    inputs = PolicyLossInputs(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix)
    pg_loss, metrics = ca.get_policy_loss_fn("sft_multitask")(inputs, loss_section(**knobs))
    return {"pg_loss": pg_loss, **metrics}


def test_sft_multitask_combines_sft_on_off_rows_with_ppo_on_on_rows():
    old, lp, adv, mask, prefix = _sft_batch()
    out = _sft_multitask(old, lp, adv, mask, prefix, clip_ratio=0.2, sft_loss_coef=2.0, loss_remove_clip=True)
    # sft = 1.039721 on row 0 (whole row, not just the prefix token); pg_on = -1.2 (token mean of 2)
    assert out["sft_loss"].item() == pytest.approx(1.0397208)
    assert out["on_pg_loss"].item() == pytest.approx(-1.2)
    assert out["pg_loss"].item() == pytest.approx(2 * 1.0397208 - 1.2, abs=1e-6)
    assert out["ppo_kl"].item() == pytest.approx(-LN(1.2), abs=1e-6)
    (grad,) = torch.autograd.grad(out["pg_loss"], lp)
    # row 0: 2 * (-1/2) per valid token; row 1: -1.2/2 per valid token
    assert torch.allclose(grad, torch.tensor([[-1.0, -1.0, 0.0], [-0.6, -0.6, 0.0]]), atol=1e-6)
    clipped = _sft_multitask(old, lp, adv, mask, prefix, clip_ratio=0.1, sft_loss_coef=1.0, loss_remove_token_mean=True)
    # clip at 1.1: on rows -1.1 per token, sum -2.2 over width 3
    # exact: clipfrac counts 4 of 4 tokens (order-free)
    assert clipped["on_pg_loss"].item() == pytest.approx(-2.2 / 3) and clipped["pg_clipfrac"].item() == 1.0


@pytest.mark.parametrize("all_off", [True, False])
def test_sft_multitask_with_only_one_kind_of_row_is_finite(all_off):
    old, lp, adv, mask, _ = _sft_batch()
    prefix = torch.zeros_like(mask, dtype=torch.bool)
    prefix[:, 0] = all_off
    out = _sft_multitask(old, lp, adv, mask, prefix, clip_ratio=0.2)
    assert (out["on_pg_loss"] if all_off else out["sft_loss"]).item() == 0.0  # exact: no token, the constant 0
    (grad,) = torch.autograd.grad(out["pg_loss"], lp)
    assert torch.isfinite(grad).all() and torch.isfinite(out["pg_loss"])


# ---------------------------------------------------------------- adaptive entropy coefficient
def test_adaptive_entropy_coeff_moves_log_alpha_against_entropy_gap():
    # log alpha = ln 0.01 = -4.605170; AdamW decay first: *(1 - 0.1*0.01) -> -4.600565;
    # Adam's first step is lr * sign(grad) = 0.1; grad = alpha*(H - target) > 0 when H > target
    above = mca.AdaptiveEntropyCoeff(entropy_coeff=0.01, target_entropy=0.5, alpha_lr=0.1)
    metrics = above.update(torch.tensor(1.0))
    assert metrics["actor/alpha_loss"] == pytest.approx(0.01 * 0.5)
    assert metrics["actor/entropy_coeff"] == pytest.approx(0.01)
    assert above.log_alpha.item() == pytest.approx(-4.600565 - 0.1, abs=1e-5)
    below = mca.AdaptiveEntropyCoeff(entropy_coeff=0.01, target_entropy=0.5, alpha_lr=0.1)
    below.update(0.2)
    assert below.log_alpha.item() == pytest.approx(-4.600565 + 0.1, abs=1e-5)
    assert below.coefficient(0.2) == pytest.approx(math.exp(-4.500565), rel=1e-5)


def test_adaptive_entropy_coeff_clip_state_and_fixed_variant():
    clipped = mca.AdaptiveEntropyCoeff(entropy_coeff=0.01, target_entropy=0.5, clip=0.005)
    assert clipped.coefficient(1.0) == pytest.approx(0.005)
    state = clipped.state_dict()
    clipped.update(2.0)
    clipped.load_state_dict(state)
    assert clipped.log_alpha.item() == pytest.approx(LN(0.01))
    # fixed: entropy_coeff * target / H = 0.001 * 0.2 / 0.4
    fixed = mca.AdaptiveEntropyCoeff(entropy_coeff=0.001, target_entropy=0.2, fixed=True)
    assert fixed.coefficient(torch.tensor(0.4)) == pytest.approx(0.0005)
    assert fixed.update(0.4) == {"actor/entropy_coeff": pytest.approx(0.0005)}
    with pytest.raises(ValueError, match="entropy_coeff > 0"):
        mca.AdaptiveEntropyCoeff(entropy_coeff=0.0, target_entropy=0.2)


# ---------------------------------------------------------------- rollout correction weights
def test_luffy_token_weights_only_the_on_policy_terms_by_hand():
    # row 0: two on-policy tokens, ratio 1 (inside the clip); row 1: one prefix token p = 0.5, one on-policy token
    old = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.5]]))
    lp = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    mask, prefix = torch.ones(2, 2), torch.tensor([[False, False], [True, False]])
    weights = torch.tensor([[2.0, 0.5], [9.0, 1.5]])  # 9.0 on the prefix token must not act
    inputs = PolicyLossInputs(
        log_prob=lp,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        prefix_mask=prefix,
        rollout_is_weights=weights,
    )
    cfg = loss_section(off_policy_reshape="p_div_p_0.1")
    pg_loss, metrics = ca.get_policy_loss_fn("luffy_token")(inputs, cfg)
    # on: -A*1*w = [-2.0, -0.5], [., -3.0]; off (LUFFY's p/(p+0.1) at p=0.5): -2 * 0.5/0.6 = -5/3
    assert pg_loss.item() == pytest.approx((-2.0 - 0.5 - 5.0 / 3.0 - 3.0) / 4, abs=1e-6)
    assert metrics["on_pg_loss"].item() == pytest.approx((-2.0 - 0.5 - 3.0) / 3, abs=1e-6)
    assert metrics["off_pg_loss"].item() == pytest.approx(-5.0 / 3.0, abs=1e-6)
    unweighted = ca.get_policy_loss_fn("luffy_token")(dataclasses.replace(inputs, rollout_is_weights=None), cfg)
    # exact: the weights touch only on-policy terms, so off_pg_loss is the very same arithmetic
    assert unweighted[1]["off_pg_loss"].item() == metrics["off_pg_loss"].item()


def test_luffy_token_and_sft_multitask_with_unit_weights_are_bit_for_bit_unweighted():
    torch.manual_seed(1)
    old, adv = torch.randn(4, 6) - 1.5, torch.randn(4, 6)
    lp = old + 0.2 * torch.randn(4, 6)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    prefix = torch.zeros(4, 6, dtype=torch.bool)
    prefix[2, :3] = True
    prefix[3] = True
    for name in ("luffy_token", "sft_multitask"):
        base = PolicyLossInputs(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix)
        plain = ca.get_policy_loss_fn(name)(base, loss_section())
        unit = ca.get_policy_loss_fn(name)(
            dataclasses.replace(base, rollout_is_weights=torch.ones(4, 6)), loss_section()
        )
        # exact: multiplying by weights of exactly 1.0 changes no bit (the same arithmetic otherwise)
        assert torch.equal(plain[0], unit[0]), name
        assert all(torch.equal(plain[1][k], unit[1][k]) for k in plain[1]), name
