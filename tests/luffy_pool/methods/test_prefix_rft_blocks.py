"""Prefix-RFT's pure blocks (no public code: hand-computed values): the cosine prefix share, the per-row top-entropy
prefix mask and the Dr.GRPO loss over the continuation and the kept prefix tokens."""

import math

import pytest
import torch

from luffy_pool.methods.prefix_rft import PrefixRftConfig, prefix_entropy_mask, prefix_ratio, prefix_rft_loss
from luffy_pool.methods.loss_inputs import FamilyLossInputs

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


@pytest.mark.parametrize(
    "step,expected", [(0, 0.95), (25, 0.818198), (50, 0.5), (75, 0.181802), (100, 0.05), (250, 0.05)]
)
def test_cosine_share_from_095_to_005_over_the_decay_steps(step, expected):
    assert prefix_ratio(step, PrefixRftConfig(decay_steps=100)) == pytest.approx(expected, abs=1e-6)


def test_a_zero_decay_is_refused():
    with pytest.raises(ValueError, match="decay_steps must be >= 1"):
        prefix_ratio(0, PrefixRftConfig(decay_steps=0))


def test_entropy_mask_keeps_the_top_share_of_each_rows_valid_prefix_tokens():
    entropy = torch.tensor([[0.5, 0.9, 0.1, 0.9, 0.3, 0.7], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    prefix = torch.tensor([[1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    valid = torch.ones(2, 6)
    # 5 prefix tokens: 20 % -> 1 token, the first of the two 0.9s; no prefix -> nothing
    assert prefix_entropy_mask(entropy, prefix, valid, 0.2).tolist() == [[0, 1, 0, 0, 0, 0], [0] * 6]
    # 50 % -> ceil(2.5) = 3: both 0.9s and the 0.5
    assert prefix_entropy_mask(entropy, prefix, valid, 0.5).tolist()[0] == [1, 1, 0, 1, 0, 0]
    # a padded prefix position is not a candidate: 4 valid prefix tokens, 50 % -> 2
    valid[0, 3] = 0
    assert prefix_entropy_mask(entropy, prefix, valid, 0.5).tolist()[0] == [1, 1, 0, 0, 0, 0]


def test_entropy_mask_count_is_exact_where_the_float_product_is_not():
    entropy = torch.arange(15, dtype=torch.float32).unsqueeze(0)  # 0.2 * 15 = 3.0000000000000004 in floats
    mask = prefix_entropy_mask(entropy, torch.ones(1, 15, dtype=torch.bool), torch.ones(1, 15), 0.2)
    assert mask.sum() == 3 and mask[0, -3:].tolist() == [1, 1, 1]


def _inputs(log_prob):
    return FamilyLossInputs(
        log_prob=log_prob,
        old_log_prob=torch.tensor([[-1.0, -0.6, -0.2, -0.1]]),
        advantages=torch.ones(1, 4),
        response_mask=torch.ones(1, 4),
        prefix_mask=torch.tensor([[1, 1, 0, 0]], dtype=torch.bool),
        entropy=torch.tensor([[0.2, 0.8, 1.0, 1.0]]),
    )


def test_loss_trains_the_continuation_and_the_high_entropy_prefix_token_only():
    # kept: prefix token 1 (entropy 0.8 > 0.2; 50 % of 2 -> 1) and the continuation; ratios e^0.3 (clipped to
    # 1.2), 1, e^-0.2 with A = 1: (-1.2 - 1 - e^-0.2) / 4 = -0.754683 (Dr.GRPO), / 3 as a token mean
    log_prob = torch.tensor([[-1.0, -0.3, -0.2, -0.3]], requires_grad=True)
    cfg = PrefixRftConfig(prefix_entropy_top_frac=0.5, loss_remove_token_mean=True)
    loss, metrics = prefix_rft_loss(_inputs(log_prob), cfg)
    assert loss.item() == pytest.approx(-0.754683, abs=1e-6)
    assert metrics["prefix_rft/kept_prefix_share"].item() == 0.5  # exact: 1 of 2 counted tokens (order-free)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["prefix_rft/prefix_entropy"].item() == pytest.approx(0.5)
    loss.backward()
    # exact: a true zero (order-free), the token is dropped by entropy; clipped
    assert log_prob.grad[0, 0] == 0.0 and log_prob.grad[0, 1] == 0.0
    assert log_prob.grad[0, 2] == pytest.approx(-0.25) and log_prob.grad[0, 3] == pytest.approx(-math.exp(-0.2) / 4)
    token_mean, _ = prefix_rft_loss(
        _inputs(log_prob.detach()), PrefixRftConfig(prefix_entropy_top_frac=0.5, loss_remove_token_mean=False)
    )
    assert token_mean.item() == pytest.approx(-1.006244, abs=1e-6)


def test_loss_needs_entropies():
    inputs = FamilyLossInputs(
        log_prob=torch.zeros(1, 2),
        old_log_prob=torch.zeros(1, 2),
        advantages=torch.ones(1, 2),
        response_mask=torch.ones(1, 2),
        prefix_mask=torch.zeros(1, 2, dtype=torch.bool),
    )
    with pytest.raises(ValueError, match="prefix_rft loss needs inputs.entropy"):
        prefix_rft_loss(inputs, PrefixRftConfig())
