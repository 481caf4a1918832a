"""HPT's gate and SFT/RL loss against the authors' functions (tests/data/family_golden/hpt_srft_golden.pt:
TsinghuaC3I/Unify-Post-Training at ae332f5f)."""

import os

import pytest
import torch

from luffy_pool.methods.hpt import HptConfig, hpt_sft_loss, hpt_switch_gate
from luffy_pool.methods.loss_inputs import FamilyLossInputs
from tests.helpers.float_compare import assert_float_close

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

GOLDEN = torch.load(
    os.path.join(os.path.dirname(__file__), "../../data/family_golden/hpt_srft_golden.pt"), weights_only=False
)
# float32 losses and gradients are sums whose rounding follows the CPU's vector width: compared within a few ulps
# of their scale (tests/helpers/float_compare.py); ids, masks and schedule values stay exact (order-free).


@pytest.mark.parametrize("i", range(len(GOLDEN["gate"])))
def test_gate_equals_authors(i):
    case = GOLDEN["gate"][i]
    cfg = HptConfig(**case["cfg"])
    assert [hpt_switch_gate(c, cfg) for c in range(9)] == case["decisions"]


def test_gate_rejects_unhandled_strategy():
    # their yaml default "balance" falls through select_on_off_ada_balance and returns None
    with pytest.raises(ValueError, match="balance"):
        hpt_switch_gate(0, HptConfig(unify_strategy="balance"))


@pytest.mark.parametrize("i", range(len(GOLDEN["hpt_sft"])))
def test_sft_loss_equals_authors(i):
    case = GOLDEN["hpt_sft"][i]
    log_prob = case["log_prob"].clone().requires_grad_(True)
    loss, metrics = hpt_sft_loss(
        FamilyLossInputs(
            log_prob=log_prob,
            old_log_prob=case["old_log_prob"],
            advantages=case["advantages"],
            response_mask=case["mask"],
            prefix_mask=case["prefix_mask"],
        ),
        HptConfig(**case["cfg"]),
    )
    loss.backward()
    assert_float_close(loss.detach(), case["loss"], what="loss")
    assert_float_close(log_prob.grad, case["grad"], what="grad")
    assert_float_close(metrics["sft_loss"], case["sft_loss"], what="sft_loss")  # NaN where theirs is NaN
    assert_float_close(metrics["pg_clipfrac"], case["pg_clipfrac"], what="pg_clipfrac")
    assert_float_close(metrics["ppo_kl"], case["ppo_kl"], what="ppo_kl")


def test_hand_values_sft_switch():
    # demo row (SFT) with ℓ = [-0.1, -0.5, -1.0]; two on rows at ratio 1 with A = ±0.5, 2 tokens each, L = 4
    log_prob = torch.tensor([[-0.1, -0.5, -1.0, 0], [-0.2, -0.3, 0, 0], [-0.4, -0.6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.float)
    prefix = torch.zeros(3, 4, dtype=torch.bool)
    prefix[0, :3] = True
    adv = torch.tensor([[0.0], [0.5], [-0.5]]).expand(3, 4)
    loss, metrics = hpt_sft_loss(
        FamilyLossInputs(
            log_prob=log_prob, old_log_prob=log_prob, advantages=adv, response_mask=mask, prefix_mask=prefix
        ),
        HptConfig(),
    )
    assert float(metrics["sft_loss"]) == pytest.approx(1.6 / 3)
    assert float(metrics["on_pg_loss"]) == pytest.approx((-0.5 * 2 + 0.5 * 2) / 4)
    assert float(loss) == pytest.approx(1.6 / 3)
