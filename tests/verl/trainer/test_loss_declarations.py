"""A policy loss declares, when it registers, the token sets its metrics average over and whether it takes rollout
correction's weights and bypass mode (``register_policy_loss``, verl/trainer/ppo/core_algos.py): verl's actor,
step metrics and config rules read those tables and name no trainer package's loss."""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

import pytest
import torch

from verl.trainer.ppo import core_algos as ca
from verl.trainer.ppo.rollout_corr import config_errors
from verl.utils.step_metrics import LOSS_METRIC_TOKENS, StepMetrics

VERL = os.path.join(os.path.dirname(os.path.abspath(ca.__file__)), "..", "..")


def _loss(inputs, cfg):
    return inputs.log_prob.sum(), {}


FULL_TOKENS = {"actor/off_metric": "off", "actor/on_metric": "on_rows"}


def _register_full():
    ca.register_policy_loss(
        "decl_test_full", metric_tokens=FULL_TOKENS, supports_rollout_is=True, supports_bypass_mode=True
    )(_loss)


def test_a_plain_registration_declares_nothing_it_does_not_do():
    """The defaults suit a loss that knows nothing of the tables (a user's loss, the method family's): its metrics
    over all response tokens, rollout IS weights refused, bypass mode refused."""
    ca.register_policy_loss("decl_test_plain")(_loss)
    assert "decl_test_plain" not in LOSS_METRIC_TOKENS
    assert "decl_test_plain" not in ca.ROLLOUT_IS_LOSSES and "decl_test_plain" not in ca.BYPASS_LOSSES


def test_a_loss_declares_its_metric_tokens_and_rollout_correction_support():
    _register_full()
    assert LOSS_METRIC_TOKENS["decl_test_full"] == FULL_TOKENS
    assert "decl_test_full" in ca.ROLLOUT_IS_LOSSES and "decl_test_full" in ca.BYPASS_LOSSES
    assert {"vanilla"} <= ca.ROLLOUT_IS_LOSSES & ca.BYPASS_LOSSES  # verl's PPO loss declares both


def test_an_unknown_token_set_is_refused_at_registration():
    with pytest.raises(ValueError, match=re.escape("unknown token sets {'actor/x': 'prefix'}")):
        ca.register_policy_loss("decl_test_bad_tokens", metric_tokens={"actor/x": "prefix"})


def test_token_weighted_step_metrics_average_a_declared_metric_over_its_tokens():
    ca.register_policy_loss("decl_test_weighted", metric_tokens={"actor/off_metric": "off"})(_loss)
    ca.register_policy_loss("decl_test_plain")(_loss)
    mask = torch.ones(2, 4)
    prefix_a = torch.tensor([[True, True, True, False], [False] * 4])  # 3 off-policy tokens
    prefix_b = torch.tensor([[True, False, False, False], [False] * 4])  # 1 off-policy token
    for loss, expected_off in (("decl_test_weighted", (3 * 1.0 + 1 * 5.0) / 4), ("decl_test_plain", (1.0 + 5.0) / 2)):
        steps = StepMetrics("token_weighted", loss, grad_accum=1)
        steps.add_micro_batch({"actor/off_metric": 1.0, "actor/other": 2.0}, mask, prefix_a)
        steps.add_micro_batch({"actor/off_metric": 5.0, "actor/other": 4.0}, mask, prefix_b)
        out = steps.result()
        assert out["actor/off_metric"] == [expected_off]  # exact: small integers over 4 or 2
        assert out["actor/other"] == [3.0]  # undeclared: over all 8 response tokens of each micro-batch


def test_bypass_mode_is_refused_for_a_loss_that_did_not_declare_it():
    ca.register_policy_loss("decl_test_no_bypass")(_loss)
    _register_full()
    values = {
        "algorithm.rollout_correction.bypass_mode": True,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.ref.use_ref": False,
    }

    def errors(loss):
        get = {**values, "actor_rollout_ref.actor": SimpleNamespace(policy_loss=loss)}.get
        return [e for e in config_errors(get) if "needs a policy loss" in e]

    assert errors("decl_test_full") == [] and errors("vanilla") == []
    (error,) = errors("decl_test_no_bypass")
    assert "'decl_test_no_bypass'" in error and "vanilla" in error and "decl_test_full" in error


def test_verl_names_no_loss_or_estimator_of_luffy_pool():
    """LUFFY's loss and estimator names live with their registrations in luffy_pool (verl/mix_src, LUFFY's module
    paths, excepted)."""
    import luffy_pool.algorithm.mix_core_alg as mca

    names = [
        name
        for registry in (ca.POLICY_LOSS_REGISTRY, ca.ADV_ESTIMATOR_REGISTRY)
        for name, fn in registry.items()
        if fn.__module__ == mca.__name__
    ]
    assert sorted(names) == ["grpo_split", "luffy_token", "sft_multitask"]
    root = os.path.abspath(VERL)
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("mix_src", "__pycache__")]
        for f in files:
            if f.endswith((".py", ".yaml")):
                path = os.path.join(folder, f)
                text = open(path).read()
                found += [f"{os.path.relpath(path, root)}: {n}" for n in names if n in text]
    assert found == []
