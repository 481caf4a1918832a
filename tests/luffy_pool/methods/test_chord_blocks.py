"""CHORD blocks against Trinity-RFT's own functions (tests/data/family_golden/chord_golden.pt) and METHODS_SPEC §10."""

import os
from dataclasses import replace

import pytest
import torch

from luffy_pool.methods.chord import ChordConfig, chord_mixed_loss, mu_schedule, phi, sft_is_loss, sft_phi_loss
from luffy_pool.methods.loss_inputs import FamilyLossInputs
from tests.helpers.float_compare import assert_float_close

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

GOLDEN = torch.load(
    os.path.join(os.path.dirname(__file__), "../../data/family_golden/chord_golden.pt"), weights_only=False
)
# float32 losses and gradients are sums whose rounding follows the CPU's vector width: compared within a few ulps
# of their scale (tests/helpers/float_compare.py); ids, masks and schedule values stay exact (order-free).


def test_mu_schedule_equals_trinity_bit_for_bit():
    for case in GOLDEN["mu"]:
        warmup, decay, peak, valley = case["args"]
        cfg = ChordConfig(mu_warmup_steps=warmup, mu_decay_steps=decay, mu_peak=peak, mu_valley=valley)
        # exact: Python scalar float math (math.cos), no torch kernel whose rounding follows the vector width
        assert [mu_schedule(s, cfg) for s in case["steps"]] == case["mu"]


@pytest.mark.parametrize("i", range(len(GOLDEN["sft"])))
def test_sft_losses_equal_trinity(i):
    case = GOLDEN["sft"][i]
    cfg = ChordConfig(use_token_level_loss_in_sft=case["token_level"], cutoff_prob=case["cutoff_prob"])
    log_prob = case["log_prob"].clone().requires_grad_(True)
    fn = sft_phi_loss if case["kind"] == "phi" else sft_is_loss
    loss, _ = fn(
        FamilyLossInputs(log_prob=log_prob, old_log_prob=None, advantages=None, response_mask=case["mask"]), cfg
    )
    loss.backward()
    assert_float_close(loss.detach(), case["loss"], what="loss")
    assert_float_close(log_prob.grad, case["grad"], what="grad")  # φ / p are stop-gradient weights, as in Trinity


@pytest.mark.parametrize("i", range(len(GOLDEN["mixed"])))
def test_mixed_loss_equals_trinity(i):
    case = GOLDEN["mixed"][i]
    cfg = ChordConfig(**case["kwargs"])
    log_prob = case["log_prob"].clone().requires_grad_(True)
    loss, metrics = chord_mixed_loss(
        FamilyLossInputs(
            log_prob=log_prob,
            old_log_prob=case["old_log_prob"],
            advantages=case["advantages"],
            response_mask=case["mask"],
            expert_mask=case["expert_mask"],
            step=case["step"],
        ),
        cfg,
    )
    loss.backward()
    assert_float_close(loss.detach(), case["loss"], what="loss")
    assert_float_close(log_prob.grad, case["grad"], what="grad")
    assert metrics["mu"] == case["metrics"]["mu"]  # exact: μ is mu_schedule's Python scalar math (order-free)
    for key, value in case["metrics"].items():
        if key.startswith(("usual/", "expert/")):
            assert float(metrics[key]) == pytest.approx(value, rel=1e-6, abs=1e-9), key  # theirs went through .item()


def test_spec_hand_values_mu():
    chord_mu = ChordConfig(mu_warmup_steps=0, mu_decay_steps=200, mu_peak=0.9, mu_valley=0.05)
    for step, want in [
        (0, 0.9),
        (50, 0.775520),
        (100, 0.475),
        (150, 0.174480),
        (199, 0.050052),
        (200, 0.05),
        (1000, 0.05),
    ]:
        assert mu_schedule(step, chord_mu) == pytest.approx(want, abs=1e-6)
    example = ChordConfig(mu_warmup_steps=200, mu_decay_steps=400, mu_peak=0.5, mu_valley=0.02)
    for step, want in [(0, 0.0), (100, 0.25), (200, 0.5), (400, 0.26), (599, 0.020007), (600, 0.02)]:
        assert mu_schedule(step, example) == pytest.approx(want, abs=1e-6)


def test_spec_hand_values_phi():
    assert phi(torch.tensor([0.1, 0.5, 0.9])).tolist() == pytest.approx([0.09, 0.25, 0.09])
    log_prob = torch.log(torch.tensor([[0.9, 0.5, 0.1]]))
    loss, _ = sft_phi_loss(
        FamilyLossInputs(log_prob=log_prob, old_log_prob=None, advantages=None, response_mask=torch.ones(1, 3)),
        ChordConfig(),
    )
    assert float(loss) == pytest.approx(0.130001, abs=1e-6)


def test_mixed_loss_needs_expert_mask_and_registered():
    with pytest.raises(ValueError, match="expert_mask"):
        chord_mixed_loss(
            FamilyLossInputs(
                log_prob=torch.zeros(1, 2),
                old_log_prob=torch.zeros(1, 2),
                advantages=torch.zeros(1, 2),
                response_mask=torch.ones(1, 2),
            ),
            ChordConfig(),
        )
    assert replace(ChordConfig(), mu_peak=0.9).mu_peak == 0.9
