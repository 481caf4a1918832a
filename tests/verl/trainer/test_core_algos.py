"""Hand-computed checks of the registered advantage estimators, the PPO loss, aggregation and KL, called as
``fn(inputs, cfg)``; verl's signatures (``compute_grpo_outcome_advantage``, ``compute_policy_loss``, ...) keep one
equality test each."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from verl.trainer.ppo import core_algos as ca
from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs, PolicyLossInputs

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


def _outcome_rewards(scores: list[float], lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards with each score at its row's last valid token, and the matching response mask."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for row, (score, length) in enumerate(zip(scores, lengths)):
        rewards[row, length - 1] = score
        mask[row, :length] = 1
    return rewards, mask


def _grpo(rewards, mask, index, use_std=True):
    return ca.get_adv_estimator_fn("grpo")(AdvantageInputs(rewards, mask, index), AdvantageConfig(grpo_use_std=use_std))


def _ppo(old, log_prob, adv, mask, clip_ratio=0.2, loss_remove_token_mean=False, loss_remove_clip=False):
    """The registered ``vanilla`` loss -> ``(pg_loss, pg_clipfrac, ppo_kl)``."""
    inputs = PolicyLossInputs(log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask)
    pg_loss, metrics = ca.get_policy_loss_fn("vanilla")(
        inputs,
        ca.PPOClipConfig(
            clip_ratio=clip_ratio, loss_remove_token_mean=loss_remove_token_mean, loss_remove_clip=loss_remove_clip
        ),
    )
    return pg_loss, metrics["pg_clipfrac"], metrics["ppo_kl"]


# ---------------------------------------------------------------- registries
def test_registries_resolve_names_and_list_valid_ones_on_error():
    assert ca.get_adv_estimator_fn("grpo") is ca.grpo_advantage
    assert ca.get_adv_estimator_fn("gae") is ca.gae_advantage
    assert ca.get_policy_loss_fn("vanilla") is ca.ppo_clip_loss
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'.*'grpo'.*'reinforce'"):
        ca.get_adv_estimator_fn("ppo")
    with pytest.raises(ValueError, match=r"unknown policy loss 'clip'.*'vanilla'"):
        ca.get_policy_loss_fn("clip")


def test_registering_a_different_function_under_a_taken_name_fails():
    with pytest.raises(ValueError, match="already registered"):
        ca.register_adv_est("grpo")(lambda inputs, cfg: None)
    with pytest.raises(TypeError, match="needs a dataclass"):
        ca.register_policy_loss("i26_not_a_dataclass", config=dict)


def test_every_estimator_takes_the_inputs_object_and_the_algorithm_knobs():
    rewards, mask = _outcome_rewards([2.0, 0.0], [2, 3], width=3)
    inputs = AdvantageInputs(token_level_rewards=rewards, response_mask=mask, index=["a", "a"])
    # exact: small integer scores, a mean of 2 and 0/1 masks: every operation is exact (order-free)
    adv, _ = ca.get_adv_estimator_fn("reinforce")(inputs, AdvantageConfig())
    assert torch.equal(adv, torch.tensor([[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    adv, _ = ca.get_adv_estimator_fn("grpo")(inputs, AdvantageConfig(grpo_use_std=False))
    assert torch.equal(adv, torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]))
    # gamma reaches reinforce++: with gamma=0.5 the first token's return is 2·0.5
    _, returns = ca.get_adv_estimator_fn("reinforce_plus_plus")(inputs, AdvantageConfig(gamma=0.5))
    assert returns[0, 0].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs critic values"):
        ca.get_adv_estimator_fn("gae")(inputs, AdvantageConfig())
    with pytest.raises(AttributeError, match="grpo_use_std"):
        ca.get_adv_estimator_fn("grpo")(inputs, object())  # a knob the section lacks raises, never defaults


# ---------------------------------------------------------------- GRPO
@pytest.mark.parametrize("k", range(8))
def test_grpo_worked_example_without_std(k):
    # docs/METHOD.md §1.7: 8-row group, slot 0 = correct off-policy trace, slots 1..k correct, k+1..7 wrong.
    # mu = (k+1)/8, so A(correct) = 1 - (k+1)/8 = (7-k)/8 and A(wrong) = -(k+1)/8.
    # e.g. k=0: +7/8 for the trace, -1/8 for each failure; k=7: all zero.
    scores = [1.0] * (k + 1) + [0.0] * (7 - k)
    rewards, mask = _outcome_rewards(scores, lengths=[3, 2, 4, 1, 4, 2, 3, 4], width=4)
    adv, returns = _grpo(rewards, mask, np.array(["u"] * 8, dtype=object), use_std=False)
    expected_rows = torch.tensor([(7 - k) / 8] * (k + 1) + [-(k + 1) / 8] * (7 - k))
    assert torch.allclose(adv, expected_rows.unsqueeze(-1) * mask, atol=1e-7)
    assert torch.equal(adv, returns)  # exact: returns are the advantage tensor itself


def test_grpo_groups_by_uid_even_when_interleaved():
    # uid a: scores 1, 0 -> mean 1/2 -> +-1/2; uid b: 1, 1, 0 -> mean 2/3 -> 1/3, 1/3, -2/3
    rewards, mask = _outcome_rewards([1, 1, 0, 1, 0], [1] * 5, width=1)
    adv, _ = _grpo(rewards, mask, ["a", "b", "a", "b", "b"], use_std=False)
    assert torch.allclose(adv.squeeze(-1), torch.tensor([0.5, 1 / 3, -0.5, 1 / 3, -2 / 3]))


def test_grpo_with_std_uses_unbiased_std_plus_epsilon():
    # scores 1,0,0: mean 1/3, deviations 2/3,-1/3,-1/3, unbiased var (4/9+1/9+1/9)/2 = 1/3, std 0.577350
    rewards, mask = _outcome_rewards([1, 0, 0], [2, 2, 2], width=2)
    adv, _ = _grpo(rewards, mask, ["g"] * 3)
    std = math.sqrt(1 / 3) + 1e-6
    assert torch.allclose(adv[:, 0], torch.tensor([2 / 3 / std, -1 / 3 / std, -1 / 3 / std]), rtol=1e-6)
    # 1.154699, -0.577350, -0.577350 to the printed precision
    assert adv[0, 0].item() == pytest.approx(1.154699, abs=1e-5)


def test_grpo_single_row_group_uses_mean_zero_std_one():
    rewards, mask = _outcome_rewards([0.7], [2], width=3)
    with_std, _ = _grpo(rewards, mask, ["solo"])
    without_std, _ = _grpo(rewards, mask, ["solo"], use_std=False)
    assert torch.allclose(with_std, torch.tensor([[0.7 / (1 + 1e-6)] * 2 + [0.0]]))
    assert torch.allclose(without_std, torch.tensor([[0.7, 0.7, 0.0]]))


def test_grpo_zero_std_group_gives_zero_advantage():
    rewards, mask = _outcome_rewards([1, 1], [1, 1], width=1)
    adv, _ = _grpo(rewards, mask, ["g", "g"])
    assert torch.equal(adv, torch.zeros(2, 1))  # exact: (1 - 1) / (0 + eps) is a true 0


def test_grpo_rejects_index_of_wrong_length():
    rewards, mask = _outcome_rewards([1, 0], [1, 1], width=1)
    with pytest.raises(ValueError, match="index has 1 entries but the batch has 2 rows"):
        _grpo(rewards, mask, ["g"])


# ---------------------------------------------------------------- REINFORCE, REINFORCE++, GAE
def test_reinforce_broadcasts_raw_score():
    rewards = torch.tensor([[0.0, 0.0, 2.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, returns = ca.get_adv_estimator_fn("reinforce")(AdvantageInputs(rewards, mask, None), AdvantageConfig())
    # exact: the raw score (a sum of one value and zeros) times a 0/1 mask; returns are the advantage itself
    assert torch.equal(adv, torch.tensor([[2.0, 2.0, 2.0], [1.0, 1.0, 0.0]]))
    assert torch.equal(returns, adv)


def test_reinforce_plus_plus_discounts_then_whitens():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, returns = ca.get_adv_estimator_fn("reinforce_plus_plus")(
        AdvantageInputs(rewards, mask, None), AdvantageConfig(gamma=0.5)
    )
    # returns: row0 [0.25, 0.5, 1], row1 [0.5, 1, 0]
    assert torch.allclose(returns, torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]]))
    # valid values 0.25,0.5,1,0.5,1: mean 0.65, squared deviations sum 0.45, unbiased var 0.1125,
    # std 0.335410 -> (x-0.65)/std
    expected = torch.tensor([[-1.192570, -0.447214, 1.043498], [-0.447214, 1.043498, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_gae_three_tokens_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    # gamma=lam=1: delta = [0.1, 0.1, 0.3] -> A = [0.5, 0.4, 0.3], returns = A + V = [1, 1, 1];
    # whitened: mean 0.4, unbiased std 0.1 -> [1, 0, -1]
    gae = ca.get_adv_estimator_fn("gae")
    inputs = AdvantageInputs(rewards, mask, None, values=values)
    adv, returns = gae(inputs, AdvantageConfig(gamma=1.0, lam=1.0))
    assert torch.allclose(returns, torch.ones(1, 3))
    assert torch.allclose(adv, torch.tensor([[1.0, 0.0, -1.0]]), atol=1e-5)
    # gamma=0.9, lam=0.5: delta2 = 0.3, delta1 = 0.9*0.7-0.6 = 0.03, delta0 = 0.9*0.6-0.5 = 0.04;
    # A2 = 0.3, A1 = 0.03 + 0.45*0.3 = 0.165, A0 = 0.04 + 0.45*0.165 = 0.11425
    _, returns = gae(inputs, AdvantageConfig(gamma=0.9, lam=0.5))
    assert torch.allclose(returns, torch.tensor([[0.61425, 0.765, 1.0]]))


def test_gae_without_critic_values_is_a_clear_error():
    with pytest.raises(ValueError, match="needs critic values"):
        ca.get_adv_estimator_fn("gae")(AdvantageInputs(torch.zeros(1, 2), torch.ones(1, 2), None), AdvantageConfig())


def test_verls_estimator_signatures_are_the_registered_estimators():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.1, 0.2, 0.3], [0.0, 0.4, 0.2]])
    index = ["a", "a", "b"]
    pairs = [
        (
            ca.compute_grpo_outcome_advantage(rewards, mask, index, epsilon=1e-3, use_std=True),
            ("grpo", AdvantageInputs(rewards, mask, index), AdvantageConfig(epsilon=1e-3)),
        ),
        (
            ca.compute_reinforce_outcome_advantage(rewards, mask),
            ("reinforce", AdvantageInputs(rewards, mask, None), AdvantageConfig()),
        ),
        (
            ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.7),
            ("reinforce_plus_plus", AdvantageInputs(rewards, mask, None), AdvantageConfig(gamma=0.7)),
        ),
        (
            ca.compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.5),
            ("gae", AdvantageInputs(rewards, mask, None, values=values), AdvantageConfig(gamma=0.9, lam=0.5)),
        ),
    ]
    for (adv, returns), (name, inputs, cfg) in pairs:
        expected_adv, expected_returns = ca.get_adv_estimator_fn(name)(inputs, cfg)
        # exact: verl's signature calls the same registered estimator on the same tensors (order-free)
        assert torch.equal(adv, expected_adv) and torch.equal(returns, expected_returns), name


# ---------------------------------------------------------------- PPO loss and aggregation
def _ppo_case():
    old = torch.full((2, 3), math.log(0.5))
    ratios = torch.tensor([[1.5, 0.5, 1.1], [1.5, 0.5, 0.9]])
    log_prob = (old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return old, log_prob, adv, mask


def test_policy_loss_clipped_token_mean_by_hand():
    old, log_prob, adv, mask = _ppo_case()
    # -A*r:         [-1.5, -0.5, -1.1], [1.5, 0.5, .]
    # -A*clip(r, 0.8, max(1.0, 1.2)): [-1.2, -0.8, -1.1], [1.2, 0.8, .]
    # max:          [-1.2, -0.5, -1.1], [1.5, 0.8, .] -> sum -0.5 over 5 tokens = -0.1
    # clipped larger at (0,0) and (1,1) -> 2/5
    pg_loss, clipfrac, ppo_kl = _ppo(old, log_prob, adv, mask)
    assert pg_loss.item() == pytest.approx(-0.1, abs=1e-6)
    assert clipfrac.item() == pytest.approx(0.4)
    # ppo_kl = mean(-ln r) = -(ln1.5 + ln0.5 + ln1.1 + ln1.5 + ln0.5)/5 = 0.0960108
    assert ppo_kl.item() == pytest.approx(0.0960108, abs=1e-6)
    # gradient d/dl of the token mean: -A*r/5 where unclipped is active, 0 where clipped
    pg_loss.backward()
    expected_grad = torch.tensor([[0.0, -0.5 / 5, -1.1 / 5], [1.5 / 5, 0.0, 0.0]])
    assert torch.allclose(log_prob.grad, expected_grad, atol=1e-6)


def test_policy_loss_remove_token_mean_divides_by_width():
    old, log_prob, adv, mask = _ppo_case()
    pg_loss, _, _ = _ppo(old, log_prob, adv, mask, loss_remove_token_mean=True)
    assert pg_loss.item() == pytest.approx(-0.5 / 3, abs=1e-6)


def test_policy_loss_remove_clip_and_no_clip_upper_bound():
    old, log_prob, adv, mask = _ppo_case()
    # no clip: -1.5-0.5-1.1+1.5+0.5 = -1.1 over 5 -> -0.22, clipfrac 0
    pg_loss, clipfrac, _ = _ppo(old, log_prob, adv, mask, loss_remove_clip=True)
    assert pg_loss.item() == pytest.approx(-0.22, abs=1e-6) and clipfrac.item() == 0.0  # exact: the constant 0
    # LUFFY's compute_policy_loss has no clip_upper_bound (docs/DESIGN.md §1 item 5): the key acts in its off-policy loss only.
    assert list(inspect.signature(ca.compute_policy_loss).parameters) == [
        "old_log_prob",
        "log_prob",
        "advantages",
        "eos_mask",
        "cliprange",
        "loss_remove_token_mean",
        "loss_remove_clip",
    ]
    with pytest.raises(TypeError):
        ca.compute_policy_loss(old, log_prob, adv, mask, cliprange=0.2, clip_upper_bound=1.4)


def test_the_registered_ppo_loss_is_verls_compute_policy_loss_on_the_inputs_object():
    old, log_prob, adv, mask = _ppo_case()
    inputs = PolicyLossInputs(log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask)
    pg_loss, metrics = ca.ppo_clip_loss(
        inputs, ca.PPOClipConfig(clip_ratio=0.2, loss_remove_token_mean=True, loss_remove_clip=False)
    )
    verl_form = ca.compute_policy_loss(old, log_prob, adv, mask, 0.2, loss_remove_token_mean=True)
    # exact: compute_policy_loss calls the same ppo_clip_loss on the same tensors (order-free)
    assert torch.equal(pg_loss, verl_form[0]) and sorted(metrics) == ["pg_clipfrac", "ppo_kl"]
    assert torch.equal(metrics["pg_clipfrac"], verl_form[1]) and torch.equal(metrics["ppo_kl"], verl_form[2])


def test_aggregation_is_token_mean_or_luffys_sum_over_width():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # valid: 1, 2, 4 (sum 7 over 3 tokens; the tensor is 3 wide)
    assert ca.aggregate_token_loss(loss, mask, loss_remove_token_mean=False).item() == pytest.approx(7 / 3)
    assert ca.aggregate_token_loss(loss, mask, loss_remove_token_mean=True).item() == pytest.approx(7 / 3)
    assert ca.aggregate_token_loss(loss[:2, :2], torch.ones(2, 2), loss_remove_token_mean=True).item() == pytest.approx(
        (1 + 2 + 4 + 5) / 2
    )  # a 2-wide tensor: Σ L·m / 2, not / 4 tokens
    for remove_token_mean in (False, True):
        # exact: an all-zero mask gives a true 0 (order-free)
        assert ca.aggregate_token_loss(loss, torch.zeros_like(mask), remove_token_mean).item() == 0.0


# ---------------------------------------------------------------- KL
def test_kl_penalty_estimators_by_hand():
    logprob, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    # d = 0.5: kl 0.5, abs 0.5, mse 0.125, k3 = exp(-0.5) + 0.5 - 1 = 0.106531
    assert ca.kl_penalty(logprob, ref, "kl").item() == pytest.approx(0.5)
    assert ca.kl_penalty(ref, logprob, "abs").item() == pytest.approx(0.5)
    assert ca.kl_penalty(logprob, ref, "mse").item() == pytest.approx(0.125)
    assert ca.kl_penalty(logprob, ref, "low_var_kl").item() == pytest.approx(0.1065307, abs=1e-6)
    # verl >= 0.4's names: k1 = kl, k2 = mse, k3 = low_var_kl
    for alias, name in (("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")):
        # exact: the alias runs the same estimator on the same tensors (order-free)
        assert torch.equal(ca.kl_penalty(logprob, ref, alias), ca.kl_penalty(logprob, ref, name))
    # d = -20: exp(20) - 21 is clamped to 10 (exact: the clamp's bound)
    assert ca.kl_penalty(torch.tensor([-20.0]), torch.tensor([0.0]), "low_var_kl").item() == 10.0


def test_kl_penalty_rejects_full_and_unknown():
    with pytest.raises(ValueError, match="full"):
        ca.kl_penalty(torch.zeros(1), torch.zeros(1), "full")
    with pytest.raises(ValueError, match=r"unknown kl_penalty 'k9'.*low_var_kl.*'k1', 'k2', 'k3'"):
        ca.kl_penalty(torch.zeros(1), torch.zeros(1), "k9")


def test_kl_controllers():
    fixed = ca.get_kl_controller({"type": "fixed", "kl_coef": 0.01})
    fixed.update(current_kl=5.0, n_steps=100)
    assert fixed.value == 0.01
    adaptive = ca.get_kl_controller({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.05, "horizon": 100})
    # error = clip(0.1/0.05 - 1, -0.2, 0.2) = 0.2 -> beta *= 1 + 0.2*10/100 = 1.02
    adaptive.update(current_kl=0.1, n_steps=10)
    assert adaptive.value == pytest.approx(0.102)
    # error = clip(0 - 1) = -0.2 -> beta *= 0.98
    adaptive.update(current_kl=0.0, n_steps=10)
    assert adaptive.value == pytest.approx(0.09996)
    with pytest.raises(ValueError, match="target_kl and kl_ctrl.horizon"):
        ca.get_kl_controller({"type": "adaptive", "kl_coef": 0.1})
    with pytest.raises(ValueError, match="unknown algorithm.kl_ctrl.type 'pid'"):
        ca.get_kl_controller({"type": "pid"})


def test_apply_kl_penalty_without_ref_keeps_scores_and_logs_zero():
    scores = torch.tensor([[0.0, 1.0]])
    rewards, metrics = ca.apply_kl_penalty(
        scores, torch.zeros(1, 2), None, torch.ones(1, 2), ca.FixedKLController(0.1), "kl"
    )
    assert torch.equal(rewards, scores)  # exact: without a reference the scores pass through untouched
    assert metrics == {"critic/kl": 0.0, "critic/kl_coeff": 0.0}


def test_apply_kl_penalty_with_ref_subtracts_beta_kl():
    scores = torch.tensor([[0.0, 0.0, 1.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # kl*mask = [0.5, 0, 0]; beta 0.1 -> rewards [-0.05, 0, 1]; critic/kl = token mean 0.5/2 = 0.25
    rewards, metrics = ca.apply_kl_penalty(scores, old, ref, mask, ca.FixedKLController(0.1), "kl")
    assert torch.allclose(rewards, torch.tensor([[-0.05, 0.0, 1.0]]))
    assert metrics["critic/kl"] == pytest.approx(0.25) and metrics["critic/kl_coeff"] == 0.1


# ---------------------------------------------------------------- rollout correction weights
def _weighted_ppo(old, log_prob, adv, mask, weights, loss_remove_token_mean=False):
    inputs = PolicyLossInputs(
        log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask, rollout_is_weights=weights
    )
    return ca.get_policy_loss_fn("vanilla")(
        inputs, ca.PPOClipConfig(clip_ratio=0.2, loss_remove_token_mean=loss_remove_token_mean, loss_remove_clip=False)
    )


def test_policy_loss_multiplies_token_terms_by_rollout_is_weights_by_hand():
    old, log_prob, adv, mask = _ppo_case()
    weights = torch.tensor([[2.0, 0.5, 1.0], [0.25, 1.0, 7.0]])  # 7.0 sits on padding: masked out
    # token terms (test above): [-1.2, -0.5, -1.1], [1.5, 0.8, .] times w:
    # [-2.4, -0.25, -1.1], [0.375, 0.8, .] -> sum -2.575 over 5 tokens = -0.515; over width 3: -2.575 / 3
    pg_loss, metrics = _weighted_ppo(old, log_prob, adv, mask, weights)
    assert pg_loss.item() == pytest.approx(-0.515, abs=1e-6)
    assert _weighted_ppo(old, log_prob.detach(), adv, mask, weights, True)[0].item() == pytest.approx(
        -2.575 / 3, abs=1e-6
    )
    # the weights are constants: the gradient of each unclipped term is scaled by its weight
    pg_loss.backward()
    expected_grad = torch.tensor([[0.0, -0.5 * 0.5 / 5, -1.1 / 5], [1.5 * 0.25 / 5, 0.0, 0.0]])
    assert torch.allclose(log_prob.grad, expected_grad, atol=1e-6)
    # clipfrac and ppo_kl describe the ratio, not the weights
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.4)


def test_policy_loss_with_unit_weights_is_bit_for_bit_the_unweighted_loss():
    torch.manual_seed(0)
    old, adv = torch.randn(4, 7) - 2.0, torch.randn(4, 7)
    mask = (torch.rand(4, 7) > 0.3).float()
    for remove_token_mean in (False, True):
        lp_a, lp_b = (old + 0.3 * torch.randn(4, 7)).requires_grad_(True), None
        lp_b = lp_a.detach().clone().requires_grad_(True)
        plain = _weighted_ppo(old, lp_a, adv, mask, None, remove_token_mean)
        unit = _weighted_ppo(old, lp_b, adv, mask, torch.ones(4, 7), remove_token_mean)
        # exact: multiplying by weights of exactly 1.0 changes no bit (the same arithmetic otherwise)
        assert torch.equal(plain[0], unit[0])
        assert all(torch.equal(plain[1][k], unit[1][k]) for k in plain[1])
        plain[0].backward()
        unit[0].backward()
        assert torch.equal(lp_a.grad, lp_b.grad)
