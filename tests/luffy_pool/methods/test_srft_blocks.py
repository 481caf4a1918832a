"""SRFT (HPT authors' implementation) against their functions (tests/data/family_golden/hpt_srft_golden.pt) and
METHODS_SPEC §10's hand values."""

import os

import pytest
import torch

from luffy_pool.methods.loss_inputs import FamilyLossInputs
from luffy_pool.methods.srft import SrftConfig, srft_coefficients, srft_loss
from tests.helpers.float_compare import assert_float_close

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

GOLDEN = torch.load(
    os.path.join(os.path.dirname(__file__), "../../data/family_golden/hpt_srft_golden.pt"), weights_only=False
)
# float32 losses and gradients are sums whose rounding follows the CPU's vector width: compared within a few ulps
# of their scale (tests/helpers/float_compare.py); ids, masks and schedule values stay exact (order-free).


@pytest.mark.parametrize("i", range(len(GOLDEN["srft"])))
def test_srft_loss_equals_authors(i):
    case = GOLDEN["srft"][i]
    log_prob = case["log_prob"].clone().requires_grad_(True)
    loss, metrics = srft_loss(
        FamilyLossInputs(
            log_prob=log_prob,
            old_log_prob=case["old_log_prob"],
            advantages=case["advantages"],
            response_mask=case["mask"],
            prefix_mask=case["prefix_mask"],
            entropy=case["entropy"],
            correct_mask=case["correct_mask"],
        ),
        SrftConfig(**case["cfg"]),
    )
    loss.backward()
    assert_float_close(loss.detach(), case["loss"], what="loss")
    assert_float_close(log_prob.grad, case["grad"], what="grad")
    assert_float_close(metrics["sft_loss"], case["sft_loss"], what="sft_loss")  # NaN where theirs is NaN
    for key in ("off_pg_loss", "on_pg_loss", "on_pg_clipfrac", "ppo_kl"):
        assert_float_close(metrics[key], case["ret"][key], what=key)


def test_spec_hand_values_coefficients():
    cfg = SrftConfig()
    h = torch.tensor([[0.0], [0.5], [1.0], [2.0]])
    _, w_sft, a_pos = srft_coefficients(h, torch.ones(4, 1), cfg)
    assert w_sft.tolist() == pytest.approx([0.5, 0.303265, 0.183940, 0.067668], abs=1e-6)
    assert a_pos.tolist() == pytest.approx([0.1, 0.164872, 0.271828, 0.738906], abs=1e-6)


def test_spec_hand_values_toy_srft():
    log_prob = torch.tensor([[-0.1, -0.5, -1.0, 0.0], [-0.3] * 4, [-0.7, -0.2, 0, 0], [-0.4, -0.6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.float)
    prefix = torch.zeros(4, 4, dtype=torch.bool)
    prefix[0, :3] = True
    adv = torch.tensor([0.5, 0.5, -0.5, -0.5]).unsqueeze(-1).expand(4, 4)
    entropy = torch.tensor([[0.2, 0.4, 0.6, 0.0], [1.0] * 4, [0.3, 0.3, 0, 0], [0.9, 0.1, 0, 0]])
    correct = torch.tensor([True, True, False, False])
    loss, metrics = srft_loss(
        FamilyLossInputs(
            log_prob=log_prob,
            old_log_prob=log_prob,
            advantages=adv,
            response_mask=mask,
            prefix_mask=prefix,
            entropy=entropy,
            correct_mask=correct,
        ),
        SrftConfig(),
    )
    assert float(metrics["sft_loss"]) == pytest.approx(0.178752, abs=1e-6)
    assert float(loss - metrics["sft_loss"]) == pytest.approx(-0.711603, abs=1e-6)
    assert float(loss) == pytest.approx(-0.532851, abs=1e-6)


def test_needs_entropy_and_is_registered():
    with pytest.raises(ValueError, match="entropy"):
        srft_loss(
            FamilyLossInputs(
                log_prob=torch.zeros(1, 1),
                old_log_prob=torch.zeros(1, 1),
                advantages=torch.zeros(1, 1),
                response_mask=torch.ones(1, 1),
            ),
            SrftConfig(),
        )
