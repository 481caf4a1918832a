"""LUFFY's token on/off-policy loss (``luffy_token``): single tokens by hand, every on- and off-policy reshape
against autograd of a direct formula, the clip, the aggregation, the metrics and the degenerate batches
(docs/METHOD.md §1.7, §1.9). Called as ``fn(inputs, cfg)`` with ``cfg`` the actor's loss section of the YAML with the
knobs a test sets (YAML key names).
"""

from __future__ import annotations

import math

import pytest
import torch

from luffy_pool.algorithm import mix_core_alg as mca
from tests.helpers.sections import loss_section
from verl.trainer.ppo import core_algos as ca
from verl.trainer.ppo.loss_inputs import PolicyLossInputs

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

LN = math.log


def _scalar_case(log_prob: float, old_log_prob: float, adv: float, prefix: bool):
    """One valid token: returns (old, log_prob leaf, adv, mask, prefix_mask) of shape [1, 1]."""
    lp = torch.tensor([[log_prob]], requires_grad=True)
    return torch.tensor([[old_log_prob]]), lp, torch.tensor([[adv]]), torch.ones(1, 1), torch.tensor([[prefix]])


def _token_loss(old, lp, adv, mask, prefix, target_probs=None, **knobs):
    """``luffy_token`` on these tensors (``target_probs``: behaviour probabilities, given to the loss as their
    log) -> ``{pg_loss, **metrics}``; clip_ratio 0.2 and clip_upper_bound 1.0 as the YAML."""
    behaviour = None if target_probs is None else target_probs.log()
    inputs = PolicyLossInputs(
        log_prob=lp,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        prefix_mask=prefix,
        behaviour_log_probs=behaviour,
    )
    pg_loss, metrics = ca.get_policy_loss_fn("luffy_token")(inputs, loss_section(**knobs))
    return {"pg_loss": pg_loss, **metrics}


# ---------------------------------------------------------------- token loss: one token by hand
# l = ln 0.6, l_old = ln 0.5 (d = ln 1.2), A = 1, no clip, token mean over one token:
# loss = -rho, d loss / d l = -d rho / d l
ON_HAND = {
    "no_reshape": (1.2, 1.2),
    "logp": (LN(1.2), 1.0),
    "p_logp": (1.2 + 0.1 * LN(1.2), 1.2 + 0.1),  # w = 0.1
    "square_root": (math.sqrt(1.2), 0.5 * math.sqrt(1.2)),
    "pow": (1.44, 2 * 1.44),  # e = 2
    "p_div_p_0.1": ((0.6 / 0.7) / (0.5 / 0.6), (0.6 / 0.7) / (0.5 / 0.6) * 0.1 / 0.7),  # 1.028571, 0.146939
    "p_div_p_0.5": ((0.6 / 1.1) / 0.5, (0.6 / 1.1) / 0.5 * 0.5 / 1.1),  # 1.090909, 0.495868
}


@pytest.mark.parametrize("reshape", list(ON_HAND))
def test_on_policy_reshape_single_token_by_hand(reshape):
    old, lp, adv, mask, prefix = _scalar_case(LN(0.6), LN(0.5), 1.0, prefix=False)
    out = _token_loss(
        old,
        lp,
        adv,
        mask,
        prefix,
        on_policy_reshape=reshape,
        on_policy_reshape_weight=0.1,
        on_policy_reshape_pow_exp=2.0,
        loss_remove_clip=True,
    )
    rho, drho = ON_HAND[reshape]
    out["pg_loss"].backward()
    assert out["pg_loss"].item() == pytest.approx(-rho, abs=1e-6)
    assert out["on_pg_loss"].item() == pytest.approx(-rho, abs=1e-6)
    assert lp.grad.item() == pytest.approx(-drho, abs=1e-6)


# l = ln 0.5 (p = 0.5), A = 1, w = 0.1, e = 2: loss = -f(p), d loss / d l = -p f'(p)
OFF_HAND = {
    "no_reshape": (0.5, 0.5),
    "logp": (0.1 * LN(0.5), 0.1),  # -0.0693147
    "p_logp": (0.5 + 0.1 * LN(0.5), 0.5 + 0.1),  # 0.4306853
    "square_root": (math.sqrt(0.5), 0.5 * math.sqrt(0.5)),  # 0.707107, 0.353553
    "pow": (0.25, 0.5),
    "p_div_p_0.1": (0.5 / 0.6, 0.1 * 0.5 / 0.6**2),  # 0.833333, gamma p/(p+gamma)^2 = 0.138889
    "p_div_p_0.3": (0.5 / 0.8, 0.3 * 0.5 / 0.8**2),  # 0.625, 0.234375
    "p_div_p_0.5": (0.5, 0.5 * 0.5 / 1.0),  # 0.5, 0.25
}


@pytest.mark.parametrize("reshape", list(OFF_HAND))
def test_off_policy_reshape_single_token_by_hand(reshape):
    # old log-prob is irrelevant for off-policy tokens: set it far away to prove it
    old, lp, adv, mask, prefix = _scalar_case(LN(0.5), -9.0, 1.0, prefix=True)
    out = _token_loss(
        old,
        lp,
        adv,
        mask,
        prefix,
        off_policy_reshape=reshape,
        off_policy_reshape_weight=0.1,
        off_policy_reshape_pow_exp=2.0,
    )
    f, df = OFF_HAND[reshape]
    out["pg_loss"].backward()
    assert out["pg_loss"].item() == pytest.approx(-f, abs=1e-6)
    assert out["off_pg_loss"].item() == pytest.approx(-f, abs=1e-6)
    assert out["off_ratio_mean"].item() == pytest.approx(f, abs=1e-6)
    assert lp.grad.item() == pytest.approx(-df, abs=1e-6)


# ---------------------------------------------------------------- token loss vs a direct formula
def _direct_loss(
    old,
    lp,
    adv,
    mask,
    prefix,
    on_reshape,
    off_reshape,
    clip,
    remove_token_mean,
    eps=0.2,
    clip_upper_bound=1.0,
    w=0.1,
    e=0.5,
):
    """The docs/METHOD.md §1.9 loss written out with probabilities instead of log-ratios."""
    p, p_old = lp.exp(), old.exp()
    shaped = lambda x, g: x / (x + g)  # noqa: E731
    rho = {
        "no_reshape": p / p_old,
        "logp": lp - old,
        "p_logp": p / p_old + w * (lp - old),
        "square_root": (p / p_old) ** 0.5,
        "pow": (p / p_old) ** e,
        "p_div_p_0.1": shaped(p, 0.1) / shaped(p_old, 0.1),
        "p_div_p_0.5": shaped(p, 0.5) / shaped(p_old, 0.5),
    }[on_reshape]
    f = {
        "no_reshape": p,
        "logp": w * lp,
        "p_logp": p + w * lp,
        "square_root": p**0.5,
        "pow": p**e,
        "p_div_p_0.1": shaped(p, 0.1),
        "p_div_p_0.3": shaped(p, 0.3),
        "p_div_p_0.5": shaped(p, 0.5),
    }[off_reshape]
    loss_on = -adv * rho
    if clip:
        loss_on = torch.maximum(loss_on, -adv * rho.clamp(1 - eps, max(clip_upper_bound, 1 + eps)))
    per_token = prefix.float() * (-adv * f) + (1 - prefix.float()) * loss_on
    denominator = mask.shape[-1] if remove_token_mean else mask.sum()
    return (per_token * mask).sum() / denominator


def _mixed_batch():
    """Row 0: full off-policy trace; row 1: on-policy; row 2: 2-token prefix then on-policy. Width 4."""
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.8, 0.2], [0.6, 0.35, 0.9, 0.15], [0.4, 0.7, 0.25, 0.5]]))
    old = torch.log(torch.tensor([[0.4, 0.3, 0.7, 0.5], [0.4, 0.45, 0.85, 0.3], [0.5, 0.6, 0.3, 0.5]]))
    adv = torch.tensor([[0.875] * 4, [-0.125] * 4, [0.5] * 4])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    prefix = torch.tensor([[True, True, True, False], [False] * 4, [True, True, False, False]])
    return old, lp.requires_grad_(True), adv, mask, prefix


@pytest.mark.parametrize("remove_token_mean", [False, True])
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("on_reshape", mca.ON_POLICY_RESHAPES)
def test_on_policy_reshapes_match_direct_formula_values_and_grads(on_reshape, clip, remove_token_mean):
    old, lp, adv, mask, prefix = _mixed_batch()
    ours = _token_loss(
        old,
        lp,
        adv,
        mask,
        prefix,
        on_policy_reshape=on_reshape,
        on_policy_reshape_weight=0.1,
        off_policy_reshape="p_div_p_0.1",
        loss_remove_clip=not clip,
        loss_remove_token_mean=remove_token_mean,
    )["pg_loss"]
    (grad_ours,) = torch.autograd.grad(ours, lp)
    direct = _direct_loss(old, lp, adv, mask, prefix, on_reshape, "p_div_p_0.1", clip, remove_token_mean)
    (grad_direct,) = torch.autograd.grad(direct, lp)
    assert ours.item() == pytest.approx(direct.item(), abs=1e-6)
    assert torch.allclose(grad_ours, grad_direct, atol=1e-6)


@pytest.mark.parametrize("remove_token_mean", [False, True])
@pytest.mark.parametrize("off_reshape", mca.OFF_POLICY_RESHAPES)
def test_off_policy_reshapes_match_direct_formula_values_and_grads(off_reshape, remove_token_mean):
    old, lp, adv, mask, prefix = _mixed_batch()
    ours = _token_loss(
        old,
        lp,
        adv,
        mask,
        prefix,
        off_policy_reshape=off_reshape,
        off_policy_reshape_weight=0.1,
        loss_remove_clip=False,
        loss_remove_token_mean=remove_token_mean,
    )["pg_loss"]
    (grad_ours,) = torch.autograd.grad(ours, lp)
    direct = _direct_loss(old, lp, adv, mask, prefix, "no_reshape", off_reshape, True, remove_token_mean)
    (grad_direct,) = torch.autograd.grad(direct, lp)
    assert ours.item() == pytest.approx(direct.item(), abs=1e-6)
    assert torch.allclose(grad_ours, grad_direct, atol=1e-6)


# ---------------------------------------------------------------- clip, aggregation, metrics
def test_on_policy_clip_upper_is_max_of_bound_and_one_plus_eps():
    # on token: rho = 0.75/0.5 = 1.5, A = 1; off token p = 0.5 (no_reshape), A = 1
    lp = torch.log(torch.tensor([[0.75, 0.5]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    adv, mask, prefix = torch.ones(1, 2), torch.ones(1, 2), torch.tensor([[False, True]])
    out = _token_loss(old, lp, adv, mask, prefix)  # upper = max(1.0, 1.2) = 1.2 (YAML's clip_ratio, clip_upper_bound)
    # L_on = max(-1.5, -1.2) = -1.2 (clipped, zero grad); L_off = -0.5; token mean -0.85
    assert out["on_pg_loss"].item() == pytest.approx(-1.2)
    assert out["pg_loss"].item() == pytest.approx(-0.85)
    # LUFFY's clipfrac is over all valid tokens: 1 clipped of 2
    assert out["on_pg_clipfrac"].item() == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(out["pg_loss"], lp)
    assert torch.allclose(grad, torch.tensor([[0.0, -0.25]]))  # off: -p/2
    wider = _token_loss(old, lp, adv, mask, prefix, clip_upper_bound=1.3)
    assert wider["on_pg_loss"].item() == pytest.approx(-1.3)
    unclipped = _token_loss(old, lp, adv, mask, prefix, loss_remove_clip=True)
    # exact: without the clip, clipfrac is the constant 0
    assert unclipped["on_pg_loss"].item() == pytest.approx(-1.5) and unclipped["on_pg_clipfrac"].item() == 0.0


def test_on_policy_lower_clip_for_negative_advantage():
    # rho = 0.5, A = -1: -A*rho = 0.5, clipped -A*0.8 = 0.8 -> 0.8
    old, lp, adv, mask, prefix = _scalar_case(LN(0.25), LN(0.5), -1.0, prefix=False)
    assert _token_loss(old, lp, adv, mask, prefix)["pg_loss"].item() == pytest.approx(0.8)


def test_metrics_and_both_aggregations_by_hand():
    # row 0 off-policy: p = 0.5, 0.25, A = 1; row 1 on-policy: p = p_old = 0.4, 0.8, A = -1
    lp = torch.log(torch.tensor([[0.5, 0.25], [0.4, 0.8]]))
    old = torch.log(torch.tensor([[0.9, 0.9], [0.4, 0.8]]))
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    prefix = torch.tensor([[True, True], [False, False]])
    out = _token_loss(old, lp, adv, torch.ones(2, 2), prefix, off_policy_reshape="p_div_p_0.1")
    f = torch.tensor([0.5 / 0.6, 0.25 / 0.35])  # 0.833333, 0.714286
    assert out["off_policy_prob"].item() == pytest.approx(0.375)  # mean p over off tokens
    assert out["on_policy_prob"].item() == pytest.approx(0.6)  # mean p_old over on tokens
    assert out["off_ratio_mean"].item() == pytest.approx(f.mean().item())
    assert out["off_pg_loss"].item() == pytest.approx(-f.mean().item())
    assert out["on_pg_loss"].item() == pytest.approx(1.0)
    # ppo_kl = mean(l_old - l): row0 ln(0.9/0.5) + ln(0.9/0.25), row1 0 -> /4
    assert out["ppo_kl"].item() == pytest.approx((LN(1.8) + LN(3.6)) / 4, abs=1e-6)
    # token mean: (-0.833333 - 0.714286 + 1 + 1)/4 = 0.113095; sum / width 2 = 0.226190
    total = (-f.sum() + 2).item()
    assert out["pg_loss"].item() == pytest.approx(total / 4, abs=1e-6)
    no_mean = _token_loss(
        old, lp, adv, torch.ones(2, 2), prefix, off_policy_reshape="p_div_p_0.1", loss_remove_token_mean=True
    )
    assert no_mean["pg_loss"].item() == pytest.approx(total / 2, abs=1e-6)


def _loss_section(compose_config, *overrides):
    from luffy_pool.config.sections import LossSection

    cfg = compose_config(["data.train_files=x", "data.val_files=null", "actor_rollout_ref.model.path=m", *overrides])
    return LossSection.from_actor_config(cfg.actor_rollout_ref.actor)


def test_off_policy_loss_coef_scales_only_the_off_policy_tokens_term(compose_config):
    from verl.trainer.ppo.loss_inputs import PolicyLossInputs

    old = torch.tensor([[LN(0.9), LN(0.9)], [LN(0.6), LN(0.6)]])
    lp = torch.tensor([[LN(0.5), LN(0.25)], [LN(0.6), LN(0.6)]], requires_grad=True)
    inputs = PolicyLossInputs(
        log_prob=lp,
        old_log_prob=old,
        advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0]]),
        response_mask=torch.ones(2, 2),
        prefix_mask=torch.tensor([[True, True], [False, False]]),
    )
    A = "actor_rollout_ref.actor"
    luffy, luffy_m = mca.luffy_token_loss(inputs, _loss_section(compose_config, f"{A}.off_policy_reshape=p_div_p_0.1"))
    half, half_m = mca.luffy_token_loss(
        inputs, _loss_section(compose_config, f"{A}.off_policy_reshape=p_div_p_0.1", f"{A}.off_policy_loss_coef=0.5")
    )
    f = torch.tensor([0.5 / 0.6, 0.25 / 0.35])
    # token mean over 4 tokens: (c·(−f₁ − f₂) + 1 + 1) / 4, c = 1 (LUFFY) and 0.5
    assert luffy.item() == pytest.approx((-f.sum() + 2).item() / 4, abs=1e-6)
    assert half.item() == pytest.approx((-0.5 * f.sum() + 2).item() / 4, abs=1e-6)
    # exact: the metrics are the terms before c, the very same arithmetic in both calls
    assert half_m["off_pg_loss"].item() == luffy_m["off_pg_loss"].item()
    assert half_m["on_pg_loss"].item() == luffy_m["on_pg_loss"].item()
    # the default is LUFFY's loss exactly: the same value as with the term's coefficient left out (exact: the same
    # function and knobs, c = 1.0 skips the multiply)
    direct = _token_loss(
        old, lp, inputs.advantages, inputs.response_mask, inputs.prefix_mask, off_policy_reshape="p_div_p_0.1"
    )
    assert torch.equal(luffy, direct["pg_loss"])


@pytest.mark.parametrize("has_prefix", [False, True])
def test_batches_without_off_or_without_on_tokens_are_finite(has_prefix):
    old, lp, adv, mask, _ = _mixed_batch()
    prefix = torch.full_like(mask, has_prefix, dtype=torch.bool)
    out = _token_loss(
        old, lp, adv, mask, prefix, off_policy_reshape="p_div_p_0.1", off_policy_max_clip=0.9, off_policy_min_clip=0.05
    )
    for key, value in out.items():
        assert torch.isfinite(value).all(), key
    empty_side = (
        ["on_pg_loss", "on_policy_prob"]
        if has_prefix
        else ["off_pg_loss", "off_policy_prob", "off_ratio_mean", "off_ratio_max_clip_frac", "off_ratio_min_clip_frac"]
    )
    for key in empty_side:
        assert out[key].item() == 0.0, key  # exact: a mean over no token is the constant 0
    (grad,) = torch.autograd.grad(out["pg_loss"], lp)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_all_padding_micro_batch_gives_zero_loss_and_zero_grad():
    old, lp, adv, _, prefix = _mixed_batch()
    out = _token_loss(old, lp, adv, torch.zeros(3, 4), prefix)
    (grad,) = torch.autograd.grad(out["pg_loss"], lp)
    assert out["pg_loss"].item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))  # exact: all masked, true 0s


def test_target_probs_replace_reshape_with_probability_ratio():
    # p = 0.5, target 0.25 -> f = 0.5/(0.25 + 1e-6) = 1.999992; loss -f, d/dl = -f
    old, lp, adv, mask, prefix = _scalar_case(LN(0.5), 0.0, 1.0, prefix=True)
    out = _token_loss(old, lp, adv, mask, prefix, off_policy_reshape="p_div_p_0.1", target_probs=torch.tensor([[0.25]]))
    f = 0.5 / (0.25 + 1e-6)
    assert out["pg_loss"].item() == pytest.approx(-f, abs=1e-5)
    (grad,) = torch.autograd.grad(out["pg_loss"], lp)
    assert grad.item() == pytest.approx(-f, abs=1e-5)
    with pytest.raises(ValueError, match="behaviour probs shape"):
        _token_loss(old, lp, adv, mask, prefix, target_probs=torch.ones(2, 1))


def test_nan_target_probs_keep_the_configured_shaping_per_token():
    # Row of 3 tokens: known behaviour 0.25 | unknown (NaN) | on-policy token with NaN (ignored by the mask).
    lp = torch.tensor([[LN(0.5), LN(0.5), LN(0.5)]], requires_grad=True)
    old = lp.detach().clone()
    adv, mask = torch.ones(1, 3), torch.ones(1, 3)
    prefix = torch.tensor([[True, True, False]])
    target = torch.tensor([[0.25, float("nan"), float("nan")]])
    out = _token_loss(old, lp, adv, mask, prefix, off_policy_reshape="p_div_p_0.1", target_probs=target)
    importance, shaped = 0.5 / (0.25 + 1e-6), 0.5 / (0.5 + 0.1)
    assert out["off_ratio_mean"].item() == pytest.approx((importance + shaped) / 2, abs=1e-5)
    assert out["pg_loss"].item() == pytest.approx((-importance - shaped - 1.0) / 3, abs=1e-5)
    (grad,) = torch.autograd.grad(out["pg_loss"], lp)
    assert torch.isfinite(grad).all()
    assert grad[0, 1].item() == pytest.approx(-(0.1 * 0.5 / 0.6**2) / 3, abs=1e-5)  # d f(p)/dl = γp/(p+γ)²


def test_off_policy_max_and_min_clip():
    # p_div_p_0.1 at p = 0.5 gives 0.833333
    old, lp, adv, mask, prefix = _scalar_case(LN(0.5), 0.0, 1.0, prefix=True)
    capped = _token_loss(old, lp, adv, mask, prefix, off_policy_reshape="p_div_p_0.1", off_policy_max_clip=0.5)
    # exact (order-free): clip fractions count one token (the constant 0 with no clamp); a clamped token's
    # gradient is a true 0
    assert capped["pg_loss"].item() == pytest.approx(-0.5) and capped["off_ratio_max_clip_frac"].item() == 1.0
    (grad,) = torch.autograd.grad(capped["pg_loss"], lp)
    assert grad.item() == 0.0
    floored = _token_loss(old, lp, adv, mask, prefix, off_policy_reshape="p_div_p_0.1", off_policy_min_clip=0.9)
    assert floored["pg_loss"].item() == pytest.approx(-0.9) and floored["off_ratio_min_clip_frac"].item() == 1.0
    off = _token_loss(
        old, lp, adv, mask, prefix, off_policy_reshape="p_div_p_0.1", off_policy_max_clip=-1, off_policy_min_clip=-1
    )
    assert off["pg_loss"].item() == pytest.approx(-0.5 / 0.6)
    assert off["off_ratio_max_clip_frac"].item() == 0.0 and off["off_ratio_min_clip_frac"].item() == 0.0


def test_all_max_clip_drops_tokens_with_high_probability():
    # two on-policy tokens with rho = 1: p = 0.6 (A = 1) and p = 0.8 (A = 3)
    lp = torch.log(torch.tensor([[0.6, 0.8]]))
    adv, mask, prefix = torch.tensor([[1.0, 3.0]]), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.bool)
    assert _token_loss(lp, lp, adv, mask, prefix)["pg_loss"].item() == pytest.approx(-2.0)
    # p = 0.8 > 0.7 is dropped: token mean -1 over one token; sum/width: -1/2
    assert _token_loss(lp, lp, adv, mask, prefix, all_max_clip=0.7)["pg_loss"].item() == pytest.approx(-1.0)
    dropped = _token_loss(lp, lp, adv, mask, prefix, all_max_clip=0.7, loss_remove_token_mean=True)
    assert dropped["pg_loss"].item() == pytest.approx(-0.5)


def test_bad_options_are_rejected_with_valid_names():
    old, lp, adv, mask, prefix = _scalar_case(LN(0.5), LN(0.5), 1.0, prefix=True)
    with pytest.raises(ValueError, match=r"unknown off_policy_reshape 'p_div_p_0.2'.*'p_div_p_0.3'"):
        _token_loss(old, lp, adv, mask, prefix, off_policy_reshape="p_div_p_0.2")
    with pytest.raises(ValueError, match=r"unknown on_policy_reshape 'p_div_p_0.3'.*'p_div_p_0.5'"):
        _token_loss(old, lp, adv, mask, prefix, on_policy_reshape="p_div_p_0.3")
