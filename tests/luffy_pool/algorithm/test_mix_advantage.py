"""compute_mixed_advantage: the estimator chosen by name, then the post-processing in order, on hand values."""

import pytest
import torch

from luffy_pool.config.sections import ConfigSections
from luffy_pool.algorithm.mix_advantage import compute_mixed_advantage

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

EOS, PAD = 2, 0


def _batch():
    # one group of 3 rows, prompt width 1, response width 3; row 0 carries a 2-token off-policy prefix
    return {
        "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]]),
        "prefix_mask": torch.tensor([[1, 1, 0], [0, 0, 0], [0, 0, 0]]),
        "responses": torch.tensor([[5, 6, EOS], [5, EOS, PAD], [5, 6, 7]]),
    }  # row 2: truncated, no EOS


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=0)
    return True


def _config(compose_config, *overrides):
    return ConfigSections.from_config(
        compose_config(
            [
                "data.train_files=x",
                "data.val_files=null",
                "actor_rollout_ref.model.path=m",
                "algorithm.grpo_use_std=False",
                *overrides,
            ]
        )
    )


def _adv(compose_config, *overrides):
    adv, _ = compute_mixed_advantage(
        _config(compose_config, *overrides),
        _batch(),
        ["g", "g", "g"],
        response_length=3,
        n_samples=3,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    return adv


def test_grpo_keeps_the_off_policy_row_in_the_group_and_grpo_split_leaves_it_out(compose_config):
    # scores [1, 0, 1]: grpo mean 2/3; grpo_split mean over on-policy rows 1, 2 = 1/2
    assert _close(_adv(compose_config), [[1 / 3] * 3, [-2 / 3, -2 / 3, 0.0], [1 / 3] * 3])
    split = _adv(compose_config, "algorithm.adv_estimator=grpo_split")
    assert _close(split, [[0.5] * 3, [-0.5, -0.5, 0.0], [0.5] * 3])


def test_post_processing_weights_then_truncation_then_sft_prefix_reward(compose_config):
    R = "actor_rollout_ref.rollout"
    weighted = _adv(compose_config, f"{R}.prefix_reward_weight_alpha=2.0", f"{R}.prefix_reward_weight_beta=0.5")
    assert _close(weighted, [[2 / 3, 2 / 3, 1 / 6], [-1 / 3, -1 / 3, 0.0], [1 / 6] * 3])
    truncated = _adv(
        compose_config,
        f"{R}.prefix_reward_weight_alpha=2.0",
        f"{R}.prefix_reward_weight_beta=0.5",
        "data.disable_truncation_advantage=True",
    )
    # exact: the truncation switch only masked_fills row 2; rows 0-1 are the very same arithmetic as before
    assert truncated[2].tolist() == [0.0, 0.0, 0.0] and torch.equal(truncated[:2], weighted[:2])
    # the SFT prefix reward comes last: prefix tokens are set to weight / n, not scaled by alpha
    final = _adv(
        compose_config,
        f"{R}.prefix_reward_weight_alpha=2.0",
        f"{R}.prefix_reward_weight_beta=0.5",
        "data.disable_truncation_advantage=True",
        "actor_rollout_ref.actor.use_sft_prefix_reward=True",
        "actor_rollout_ref.actor.sft_prefix_reward_weight=1.0",
    )
    assert _close(final, [[1 / 3, 1 / 3, 1 / 6], [-1 / 3, -1 / 3, 0.0], [0.0] * 3])


def test_reinforce_plus_plus_gets_gamma_and_gae_names_the_missing_critic_values(compose_config):
    adv = _adv(compose_config, "algorithm.adv_estimator=reinforce_plus_plus", "algorithm.gamma=0.5")
    assert adv.shape == (3, 3) and torch.isfinite(adv).all()
    with pytest.raises(ValueError, match="needs critic values"):
        _adv(compose_config, "algorithm.adv_estimator=gae")
