"""What the methods' losses share: the inputs they read, their knob dataclasses, and their wiring into verl's
policy-loss registry (the call shape of verl's policy losses)."""

from dataclasses import is_dataclass

import pytest
import torch

from luffy_pool.methods.chord import ChordConfig
from luffy_pool.methods.exgrpo.blocks import ExgrpoLossConfig
from luffy_pool.methods.hpt import HptConfig
from luffy_pool.methods.loss_inputs import FamilyLossInputs, require
from luffy_pool.methods.prefix_rft import PrefixRftConfig
from luffy_pool.methods.relift import ReliftSftConfig
from luffy_pool.methods.srft import SrftConfig
from luffy_pool.methods.uft import UftConfig, UftLossConfig
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.trainer.ppo.loss_inputs import PolicyLossInputs

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

KNOBS = (
    ChordConfig,
    ExgrpoLossConfig,
    HptConfig,
    PrefixRftConfig,
    ReliftSftConfig,
    SrftConfig,
    UftConfig,
    UftLossConfig,
)


def test_every_knob_dataclass_is_frozen_with_the_authors_defaults():
    for config in KNOBS:
        assert is_dataclass(config) and config.__dataclass_params__.frozen, config.__name__
        config()  # every knob has the authors' default


def test_each_method_loss_is_registered_in_the_one_loss_table_under_the_method_name():
    """A method with a loss is one entry of verl's registry, named as the method, that calls ``method.loss``."""
    from luffy_pool.methods import METHODS

    with_loss = {name: m for name, m in METHODS.items() if m.loss is not None}
    assert set(with_loss) == {
        "ampo",
        "chord",
        "exgrpo",
        "hpt",
        "prefix_rft",
        "questa",
        "rl_plus",
        "sdft",
        "sdpo",
        "srft",
        "uft",
    }
    calls = []
    for name, method in with_loss.items():
        entry = POLICY_LOSS_REGISTRY[name]
        inputs = FamilyLossInputs(
            log_prob=None, old_log_prob=None, advantages=None, response_mask=None, knobs=f"{name}-knobs", step=7
        )
        original = method.loss
        object.__setattr__(method, "loss", lambda i, k, s, name=name: calls.append((name, k, s)) or (0.0, {}))
        try:
            entry(inputs, None)
        finally:
            object.__setattr__(method, "loss", original)
    assert sorted(calls) == sorted((n, f"{n}-knobs", 7) for n in with_loss)


def test_inputs_extend_policy_loss_inputs():
    inputs = FamilyLossInputs(
        log_prob=torch.zeros(1, 1), old_log_prob=None, advantages=None, response_mask=torch.ones(1, 1), step=3
    )
    assert isinstance(inputs, PolicyLossInputs) and inputs.entropy is None and inputs.step == 3
    with pytest.raises(ValueError, match="inputs.entropy"):
        require(inputs, "entropy", "srft")
