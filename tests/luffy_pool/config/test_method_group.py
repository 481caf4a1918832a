"""Selecting a method merges its YAML group (luffy_pool/config/method_group.py): on-policy GRPO has one spelling."""

from __future__ import annotations

import pytest

from luffy_pool.config.compose import compose_config
from luffy_pool.config.method_group import apply_method


@pytest.mark.parametrize(
    "overrides, method",
    [
        (["actor_rollout_ref.rollout.n_prefix=0"], "grpo"),  # LUFFY's keys with no off-policy slot: on-policy GRPO
        (["algorithm.method=grpo"], "grpo"),
        ([], "luffy"),  # the default keeps LUFFY's slot plan
        (["actor_rollout_ref.rollout.n_prefix=0", "actor_rollout_ref.actor.use_off_policy_loss=True"], "luffy"),
        (["actor_rollout_ref.rollout.n_prefix=0", "actor_rollout_ref.actor.policy_loss=luffy_token"], "luffy"),
    ],
)
def test_luffys_on_policy_spelling_resolves_to_grpo(overrides, method):
    config = compose_config(overrides)
    assert apply_method(config).name == method
    assert config.algorithm.method == method  # the resolved config says which method ran
    if method == "grpo":
        assert (
            config.actor_rollout_ref.actor.policy_loss == "vanilla" and config.actor_rollout_ref.rollout.n_prefix == 0
        )


def test_an_explicit_method_is_never_resolved_to_another():
    config = compose_config(["algorithm.method=relift", "actor_rollout_ref.rollout.n_prefix=0"])
    assert apply_method(config).name == "relift"
