"""The family's registry: every block registered under its kind, the call shape of verl's policy losses."""

from dataclasses import is_dataclass

import pytest
import torch

import luffy_pool.algorithm.family  # noqa: F401  (registers every block)
from luffy_pool.algorithm.family import registry
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.trainer.ppo.loss_inputs import PolicyLossInputs

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


def test_every_block_is_registered_with_its_knobs():
    assert registry.names("loss") == [
        "chord",
        "chord_ppo",
        "chord_sft",
        "chord_sft_is",
        "chord_sft_phi",
        "exgrpo_token",
        "hpt_sft",
        "prefix_rft",
        "relift_sft",
        "srft",
        "uft",
    ]
    assert registry.names("schedule") == ["chord_mu", "prefix_rft_ratio", "uft_hint"]
    assert registry.names("gate") == ["hpt_switch"]
    for kind in registry.KINDS:
        for name in registry.names(kind):
            config = registry.config_of(kind, name)
            assert is_dataclass(config) and config.__dataclass_params__.frozen, (kind, name)
            config()  # every knob has the authors' default


def test_the_losses_algorithm_method_wires_are_the_same_functions_in_the_trainer_registry():
    import luffy_pool.methods.losses  # noqa: F401 -- registers hpt_sft / srft / chord for the actor's dispatch

    wired = {"hpt_sft", "srft", "chord", "prefix_rft", "uft"}
    assert set(registry.names("loss")) & set(POLICY_LOSS_REGISTRY) == wired
    assert all(POLICY_LOSS_REGISTRY[name] is registry.get("loss", name) for name in wired)


def test_inputs_extend_policy_loss_inputs():
    inputs = registry.FamilyLossInputs(
        log_prob=torch.zeros(1, 1), old_log_prob=None, advantages=None, response_mask=torch.ones(1, 1), step=3
    )
    assert isinstance(inputs, PolicyLossInputs) and inputs.entropy is None and inputs.step == 3
    with pytest.raises(ValueError, match="inputs.entropy"):
        registry.require(inputs, "entropy", "srft")


def test_errors_name_the_valid_choices():
    with pytest.raises(ValueError, match="valid: \\['chord'"):
        registry.get("loss", "chrod")
    with pytest.raises(ValueError, match="block kind"):
        registry.get("sampler", "x")

    def other(inputs, cfg):
        return inputs, cfg

    with pytest.raises(ValueError, match="already registered"):
        registry.register("loss", "srft")(other)
