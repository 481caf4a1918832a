"""LUFFY's signatures in ``verl.mix_src.mix_core_alg`` are thin aliases: each builds the inputs and the knobs and
returns what the registered ``fn(inputs, cfg)`` returns, with the YAML's values for every knob left out."""

from __future__ import annotations

import math

import pytest
import torch

from luffy_pool.config.compose import actor_config
from luffy_pool.config.sections import LossSection
from verl.mix_src import mix_core_alg as luffy
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs, PolicyLossInputs

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


def _batch():
    """3 rows x 4 tokens of seeded probabilities: row 0 a full trace, row 1 on-policy, row 2 a 2-token prefix."""
    g = torch.Generator().manual_seed(35)
    lp, old = (0.05 + 0.9 * torch.rand(2, 3, 4, generator=g)).log()
    adv = torch.tensor([0.875, -0.125, 0.5]).unsqueeze(-1).expand(3, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0] * 4, [1.0, 1.0, 1.0, 0.0]])
    prefix = torch.tensor([[True, True, True, False], [False] * 4, [True, True, False, False]])
    return old, lp, adv, mask, prefix


def test_token_on_off_policy_loss_is_the_registered_luffy_token_loss():
    old, lp, adv, mask, prefix = _batch()
    target = torch.tensor([[0.25, float("nan"), 0.5, 1.0], [1.0] * 4, [0.125, 0.5, 1.0, 1.0]])
    out = luffy.compute_token_on_off_policy_loss(
        old,
        lp,
        adv,
        mask,
        cliprange=0.3,
        clip_upper_bound=1.5,
        prefix_mask=prefix,
        off_cliprange=0.2,
        off_max_clip=3.0,
        off_policy_reshape="logp",
        on_policy_reshape="p_logp",
        target_probs=target,
        loss_remove_token_mean=True,
    )
    cfg = LossSection.from_actor_config(
        actor_config(
            clip_ratio=0.3,
            clip_upper_bound=1.5,
            off_policy_cliprange=0.2,
            off_policy_max_clip=3.0,
            off_policy_reshape="logp",
            on_policy_reshape="p_logp",
            loss_remove_token_mean=True,
        )
    )
    pg_loss, metrics = get_policy_loss_fn("luffy_token")(
        PolicyLossInputs(
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            response_mask=mask,
            prefix_mask=prefix,
            behaviour_log_probs=target.log(),
        ),
        cfg,
    )
    # exact: the alias calls the same luffy_token_loss on the same tensors (order-free)
    assert torch.equal(out.pop("pg_loss"), pg_loss)
    # LUFFY's key: the token loss never clips off-policy tokens (exact: the constant 0)
    assert out.pop("off_pg_clipfrac").item() == 0.0
    assert out.keys() == metrics.keys() and all(torch.equal(out[k], metrics[k]) for k in metrics)


def test_left_out_knobs_take_the_yamls_values_not_luffys_signature_defaults():
    # one off-policy token, p = 0.5, A = 1, logp shaping: f = w·ln p with the YAML's w = 0.1 (LUFFY's signature: 1.0)
    lp = torch.tensor([[math.log(0.5)]])
    out = luffy.compute_token_on_off_policy_loss(
        lp,
        lp,
        torch.ones(1, 1),
        torch.ones(1, 1),
        cliprange=None,
        clip_upper_bound=None,
        prefix_mask=torch.tensor([[True]]),
        off_policy_reshape="logp",
    )
    assert actor_config().off_policy_reshape_weight == 0.1
    assert out["pg_loss"].item() == pytest.approx(-0.1 * math.log(0.5), abs=1e-7)


def test_luffys_unwired_sequence_loss_options_are_rejected():
    old, lp, adv, mask, prefix = _batch()
    with pytest.raises(ValueError, match="off_policy_normalize"):
        luffy.compute_token_on_off_policy_loss(old, lp, adv, mask, 0.2, 1.0, prefix, off_normalize=True)
    with pytest.raises(ValueError, match="off_abs_cliprange"):
        luffy.compute_token_on_off_policy_loss(old, lp, adv, mask, 0.2, 1.0, prefix, off_abs_cliprange=0.5)


def test_grpo_outcome_advantage_split_is_the_registered_grpo_split():
    rewards = torch.zeros(5, 3)
    rewards[:, -1] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5])
    mask = torch.ones(5, 3)
    index, on = ["u", "u", "u", "u", "v"], torch.tensor([False, True, True, True, True])
    for use_std in (True, False):
        adv, returns = luffy.compute_grpo_outcome_advantage_split(
            rewards, mask, index, on, epsilon=1e-3, use_std=use_std
        )
        expected = get_adv_estimator_fn("grpo_split")(
            AdvantageInputs(rewards, mask, index, on_policy_mask=on),
            AdvantageConfig(grpo_use_std=use_std, epsilon=1e-3),
        )
        # exact: the alias calls the same grpo_split estimator on the same tensors (order-free)
        assert torch.equal(adv, expected[0]) and torch.equal(returns, expected[1])


def test_compute_sft_multitask_loss_alias_equals_the_registered_loss():
    import torch

    from luffy_pool.algorithm.mix_core_alg import sft_multitask_loss
    from verl.mix_src.mix_core_alg import compute_sft_multitask_loss, luffy_loss_section
    from verl.trainer.ppo.loss_inputs import PolicyLossInputs

    g = torch.Generator().manual_seed(3)
    old, new, adv = (torch.randn(4, 5, generator=g) for _ in range(3))
    mask = torch.ones(4, 5)
    prefix = torch.zeros(4, 5, dtype=torch.bool)
    prefix[0] = True
    out = compute_sft_multitask_loss(old, new, adv, mask, prefix, cliprange=0.2, sft_loss_coef=0.5)
    cfg = luffy_loss_section(cliprange=0.2, sft_loss_coef=0.5)
    loss, metrics = sft_multitask_loss(
        PolicyLossInputs(log_prob=new, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix), cfg
    )
    # exact: the alias calls the same sft_multitask_loss on the same tensors (order-free)
    assert torch.equal(out["pg_loss"], loss) and set(out) == {"pg_loss", *metrics}
