"""UFT's hint schedule and hint tokenisation against the authors' ``RLHFDataset.__getitem__`` and
``tokenize_and_postprocess_data`` (tests/data/family_golden/uft_golden.pt: liumy2010/UFT at ad3c8ec7), and
METHODS_SPEC §10's hand values."""

import os

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from luffy_pool.methods.uft import (
    UftConfig,
    cut_points,
    hint_nll_loss,
    hint_probability,
    sample_hint,
    split_solution,
    stage_index,
    tokenize_with_hint,
)
from tests.helpers.float_compare import assert_float_close

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

DATA = os.path.join(os.path.dirname(__file__), "../../data/family_golden")
GOLDEN = torch.load(os.path.join(DATA, "uft_golden.pt"), weights_only=False)
# float32 losses and gradients are sums whose rounding follows the CPU's vector width: compared within a few ulps
# of their scale (tests/helpers/float_compare.py); ids, masks and schedule values stay exact (order-free).


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(os.path.join(DATA, "uft_tokenizer"))


@pytest.mark.parametrize("schedule", ["cosine", "stage", "uniform"])
def test_hint_sampling_and_tokenisation_equal_authors(schedule, tokenizer):
    cases = [c for c in GOLDEN["items"] if c["schedule"] == schedule]
    assert cases
    cfg = UftConfig(schedule=schedule)
    for case in cases:
        text, share = sample_hint(case["hint"], case["timestep"], cfg, np.random.RandomState(case["seed"]))
        ids, mask, _, hint_mask = tokenize_with_hint(
            case["prompt"], text, tokenizer, 96, tokenizer.pad_token_id, left_pad=True, truncation="right"
        )
        where = f"{schedule} t={case['timestep']} item={case['item']}"
        assert share == case["hint_slice_prop"], where  # exact: one Python division of two ints
        assert torch.equal(ids[0], case["input_ids"]), where
        assert torch.equal(mask[0], case["attention_mask"]), where
        assert torch.equal(hint_mask[0], case["hint_mask"]), where


def test_truncation_equals_authors(tokenizer):
    for case in GOLDEN["tokenize"]:
        got = tokenize_with_hint(
            "What is 12 + 30?",
            "12 + 30 = 42. So 42.",
            tokenizer,
            case["max_length"],
            tokenizer.pad_token_id,
            left_pad=True,
            truncation=case["truncation"],
        )
        for ours, key in zip(got, ("input_ids", "attention_mask", "hint_ids", "hint_mask")):
            assert torch.equal(ours, case[key]), (case["truncation"], key)


@pytest.mark.parametrize("i", range(len(GOLDEN["hint_nll"])))
def test_hint_nll_equals_authors(i):
    case = GOLDEN["hint_nll"][i]
    logits = case["prompt_logits"].clone().requires_grad_(True)
    loss = hint_nll_loss(logits, case["input_ids"], case["hint_mask"])
    loss.backward()
    assert_float_close(loss.detach(), case["loss"], what="loss")
    assert_float_close(logits.grad, case["grad"], what="grad")


def test_hint_nll_by_hand():
    # one row, prompt [1, 1, 2] whose last two tokens are the hint: tokenize_with_hint's mask is [1, 1, 0]
    # (positions 0 and 1 predict them)
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 1] = 200.0  # clamped to 100
    mask = torch.tensor([[1, 1, 0]])
    want = (-torch.log_softmax(torch.tensor([0.0, 100.0, 0.0, 0.0]), 0)[1] + torch.log(torch.tensor(4.0))) / 2
    assert float(hint_nll_loss(logits, torch.tensor([[1, 1, 2]]), mask)) == pytest.approx(float(want))
    # exact: no hint token, a true zero (order-free)
    assert float(hint_nll_loss(logits, torch.tensor([[1, 1, 2]]), torch.zeros(1, 3))) == 0.0


def test_spec_hand_values():
    cfg = UftConfig()
    for step, want in [
        (1, 0.949975),
        (75, 0.818198),
        (150, 0.5),
        (225, 0.181802),
        (299, 0.050025),
        (300, 0.05),
        (301, 0.0),
    ]:
        assert hint_probability(step, cfg) == pytest.approx(want, abs=1e-6)
    for step, want in [(0, 5), (49, 5), (50, 4), (100, 3), (150, 2), (200, 1), (250, 0), (300, 0)]:
        assert stage_index(step, 5, cfg) == want
    assert cut_points(3) == [0, 1, 2, 3]
    assert cut_points(11) == [0, 2, 4, 7, 9, 11]  # round(6.6)=7, round(4.4)=4, round(2.2)=2, round(8.8)=9
    assert cut_points(5 * 5 // 2) == [0, 2, 5, 7, 10, 12]  # 12 segments: round(2.4)=2, round(4.8)=5, ...


def test_empty_hint_and_splitter():
    assert sample_hint([], 1, UftConfig(), np.random.RandomState(0)) == ("", 0.0)  # theirs divides by zero
    text = "Step 1: a\n\nStep 2: b\nSo 3."
    segments = split_solution(text)
    assert segments == ["Step 1: a\n\n", "Step 2: b\n", "So 3."] and "".join(segments) == text
    with pytest.raises(ValueError, match="schedule"):
        sample_hint(["a"], 1, UftConfig(schedule="linear"), np.random.RandomState(0))


def test_uft_loss_is_grpo_on_the_continuation_plus_beta_hint_nll():
    """Hand values: row 0 has a 2-token hint (log-probs −2, −1: NLL 1.5) and one continuation token (ratio
    e^−0.1, A = 0.5), row 1 no hint and two tokens at ratio 1 with A = −0.5. Token mean over the 3 continuation
    tokens (−0.5·e^−0.1 + 0.5 + 0.5)/3 = 0.182527, plus 0.001·1.5."""
    from luffy_pool.methods.loss_inputs import FamilyLossInputs
    from luffy_pool.methods.uft import UftLossConfig, uft_loss

    log_prob = torch.tensor([[-2.0, -1.0, -0.5, -0.7], [-0.1, -0.2, -0.3, -0.4]], requires_grad=True)
    inputs = FamilyLossInputs(
        log_prob=log_prob,
        old_log_prob=torch.tensor([[-2.0, -1.0, -0.4, -0.7], [-0.1, -0.2, -0.3, -0.4]]),
        advantages=torch.tensor([[0.5] * 4, [-0.5] * 4]),
        response_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0.0]]),
        prefix_mask=torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool),
    )
    loss, metrics = uft_loss(inputs, UftLossConfig())
    assert loss.item() == pytest.approx(0.184027, abs=1e-6)
    assert metrics["uft/hint_nll"].item() == pytest.approx(1.5) and metrics["uft/pg_loss"].item() == pytest.approx(
        0.182527, abs=1e-6
    )
    loss.backward()
    assert log_prob.grad[0, :2].tolist() == pytest.approx([-0.0005, -0.0005])  # only β·NLL reaches the hint
    assert log_prob.grad[0, 3] == 0.0 and log_prob.grad[1, 2:].tolist() == [0.0, 0.0]  # exact: masked, a true 0
    # no hint anywhere: the NLL term is 0, the loss is the PG term alone
    no_hint = FamilyLossInputs(
        log_prob=log_prob.detach(),
        old_log_prob=inputs.old_log_prob,
        advantages=inputs.advantages,
        response_mask=inputs.response_mask,
        prefix_mask=torch.zeros(2, 4, dtype=torch.bool),
    )
    value, metrics = uft_loss(no_hint, UftLossConfig(hint_sft_coef=1.0))
    # exact: an empty hint gives a true zero (order-free)
    assert metrics["uft/hint_nll"].item() == 0.0 and value.item() == pytest.approx(metrics["uft/pg_loss"].item())
