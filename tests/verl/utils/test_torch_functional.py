"""Hand-computed checks of the masked statistics, log-prob/entropy helpers, masks and LR schedules."""

from __future__ import annotations

import math

import pytest
import torch

from verl.utils import torch_functional as F

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


# ---------------------------------------------------------------- masked statistics
def test_masked_sum_and_mean_count_only_masked_elements():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]])
    # selected: 1, 2, 5 -> sum 8, mean 8/3; per row: (1+2)/2 = 1.5 and 5/1 = 5
    assert F.masked_sum(values, mask).item() == pytest.approx(8.0)
    assert F.masked_mean(values, mask).item() == pytest.approx(8 / 3)
    assert torch.allclose(F.masked_mean(values, mask, axis=-1), torch.tensor([1.5, 5.0]))


def test_masked_mean_of_empty_mask_is_nan_but_or_zero_variant_is_zero_with_finite_grad():
    values = torch.tensor([1.0, 2.0], requires_grad=True)
    empty = torch.zeros(2)
    assert torch.isnan(F.masked_mean(values, empty))
    safe = F.masked_mean_or_zero(values, empty)
    safe.backward()
    # exact: an empty mask gives a true 0 and zero gradients (order-free)
    assert safe.item() == 0.0
    assert torch.equal(values.grad, torch.zeros(2))
    # non-empty: identical to masked_mean, (1+2)/2
    assert F.masked_mean_or_zero(values, torch.ones(2)).item() == pytest.approx(1.5)


def test_masked_var_biased_and_unbiased():
    values = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # mean 2, squared deviations 1,0,1 -> biased 2/3, unbiased 2/2 = 1
    assert F.masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)
    assert F.masked_var(values, mask).item() == pytest.approx(1.0)


def test_masked_var_rejects_empty_and_single_element_unbiased():
    with pytest.raises(ValueError, match="no element"):
        F.masked_var(torch.ones(3), torch.zeros(3))
    with pytest.raises(ValueError, match="at least 2"):
        F.masked_var(torch.ones(3), torch.tensor([0.0, 1.0, 0.0]))


def test_masked_whiten_centres_and_scales_by_unbiased_std():
    values = torch.tensor([1.0, 2.0, 3.0, 50.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # mean 2, unbiased var 1 -> (x - 2)/1 on the masked part
    whitened = F.masked_whiten(values, mask)
    assert torch.allclose(whitened[:3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6)
    kept_mean = F.masked_whiten(values, mask, shift_mean=False)
    assert torch.allclose(kept_mean[:3], torch.tensor([1.0, 2.0, 3.0]), atol=1e-6)


# ---------------------------------------------------------------- log-probs and entropy
def test_logprobs_from_logits_hand_case():
    # logits [0, ln 3] -> softmax [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    labels = torch.tensor([[1, 0]])
    expected = torch.tensor([[math.log(0.75), math.log(0.25)]])
    assert torch.allclose(F.logprobs_from_logits(logits, labels), expected, atol=1e-6)


def test_logprobs_from_logits_matches_log_softmax_gather_with_same_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5))
    ours = F.logprobs_from_logits(logits, labels)
    (grad_ours,) = torch.autograd.grad(ours.sum(), logits)
    direct = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    (grad_direct,) = torch.autograd.grad(direct.sum(), logits)
    assert torch.allclose(ours, direct, atol=1e-5)
    assert torch.allclose(grad_ours, grad_direct, atol=1e-6)


def test_logprobs_from_bf16_logits_are_fp32_and_close():
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 7)
    labels = torch.randint(0, 7, (3, 4))
    low = F.logprobs_from_logits(logits.bfloat16(), labels)
    assert low.dtype == torch.float32
    reference = torch.log_softmax(logits.bfloat16().float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(low, reference, atol=1e-6)


def test_logprobs_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="labels shape"):
        F.logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_entropy_from_logits_hand_values_and_direct_formula():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]])
    # uniform over 2 -> ln 2; [1/4, 3/4] -> -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335
    expected = torch.tensor([math.log(2.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))])
    assert torch.allclose(F.entropy_from_logits(logits), expected, atol=1e-6)
    torch.manual_seed(2)
    random_logits = torch.randn(4, 9)
    probs = torch.softmax(random_logits, -1)
    assert torch.allclose(F.entropy_from_logits(random_logits), -(probs * probs.log()).sum(-1), atol=1e-5)


def test_logprobs_and_entropy_in_one_pass_hand_values_and_gradients():
    # Row 0 uniform over 2: log p = ln 1/2, entropy ln 2. Row 1 [1/4, 3/4], label 1: log 3/4, entropy 0.562335.
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]])
    logp, ent = F.logprobs_and_entropy_from_logits(logits, torch.tensor([0, 1]))
    assert torch.allclose(logp, torch.tensor([math.log(0.5), math.log(0.75)]), atol=1e-6)
    assert torch.allclose(
        ent, torch.tensor([math.log(2.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]), atol=1e-6
    )
    # Same values and gradients as the two separate helpers (fp32 and fp64), on a [b, L, V] batch.
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(3)
        base = torch.randn(2, 5, 11, dtype=dtype)
        labels = torch.randint(0, 11, (2, 5))
        weights = torch.randn(2, 5, dtype=dtype)
        a = base.clone().requires_grad_(True)
        lp, en = F.logprobs_and_entropy_from_logits(a, labels)
        ((lp - 0.3 * en) * weights).sum().backward()
        b = base.clone().requires_grad_(True)
        lp2, en2 = F.logprobs_from_logits(b, labels), F.entropy_from_logits(b)
        ((lp2 - 0.3 * en2) * weights).sum().backward()
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        assert torch.allclose(lp, lp2, atol=tol) and torch.allclose(en, en2, atol=tol)
        assert torch.allclose(a.grad, b.grad, atol=tol)
    half = torch.randn(3, 7).to(torch.bfloat16)  # half precision goes through the two helpers (fp32 results)
    lp, en = F.logprobs_and_entropy_from_logits(half, torch.tensor([1, 2, 3]))
    assert lp.dtype == torch.float32 and torch.allclose(lp, F.logprobs_from_logits(half, torch.tensor([1, 2, 3])))
    with pytest.raises(ValueError, match="labels shape"):
        F.logprobs_and_entropy_from_logits(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))


# ---------------------------------------------------------------- masks, positions, padding
def test_get_eos_mask_keeps_first_eos_and_zeroes_after():
    responses = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8]])
    assert torch.equal(F.get_eos_mask(responses, eos_token=2), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))
    # either 2 or 7 ends a response
    multi = F.get_eos_mask(responses, eos_token=[2, 7], dtype=torch.float32)
    assert multi.dtype == torch.float32
    assert torch.equal(multi, torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]))  # exact: a 0/1 mask


def test_compute_position_id_with_left_and_right_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    # cumsum-1 = [-1,-1,0,1,2] -> clamp -> [0,0,0,1,2]; [0,1,2,2,2]
    assert torch.equal(F.compute_position_id_with_mask(mask), torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]))


def test_pad_2d_list_to_length():
    assert torch.equal(F.pad_2d_list_to_length([[1, 2], [3]], pad_token_id=0), torch.tensor([[1, 2], [3, 0]]))
    padded = F.pad_2d_list_to_length([[1, 2], [3]], pad_token_id=9, max_length=4)
    assert padded.dtype == torch.long
    assert torch.equal(padded, torch.tensor([[1, 2, 9, 9], [3, 9, 9, 9]]))
    with pytest.raises(ValueError, match="row 1 has 3 tokens > max_length=2"):
        F.pad_2d_list_to_length([[1], [1, 2, 3]], pad_token_id=0, max_length=2)


def test_clip_by_value_with_tensor_bounds():
    x = torch.tensor([-2.0, 0.5, 3.0])
    out = F.clip_by_value(x, torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([1.0, 1.0, 2.0]))
    assert torch.equal(out, torch.tensor([-1.0, 0.5, 2.0]))  # exact: a clamp selects values (order-free)


# ---------------------------------------------------------------- LR schedules
def _lrs(make_scheduler, n_steps: int) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = make_scheduler(optimizer)
    lrs = []
    for _ in range(n_steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_constant_schedule_default_has_no_zero_lr_first_step():
    assert _lrs(lambda o: F.get_constant_schedule_with_warmup(o, 0), 3) == pytest.approx([1.0, 1.0, 1.0])
    # warm-up 2: (s+1)/2 -> 0.5, 1, 1
    assert _lrs(lambda o: F.get_constant_schedule_with_warmup(o, 2), 3) == pytest.approx([0.5, 1.0, 1.0])


def test_constant_schedule_zero_lr_first_step_reproduces_luffy():
    # LUFFY: min(1, s/max(1, w)) -> 0 at step 0 even without warm-up
    assert _lrs(lambda o: F.get_constant_schedule_with_warmup(o, 0, zero_lr_first_step=True), 3) == pytest.approx(
        [0.0, 1.0, 1.0]
    )
    assert _lrs(lambda o: F.get_constant_schedule_with_warmup(o, 2, zero_lr_first_step=True), 4) == pytest.approx(
        [0.0, 0.5, 1.0, 1.0]
    )


def test_cosine_schedule_values():
    # w=0, T=4: 0.5(1 + cos(pi s/4)) -> 1, 0.853553, 0.5, 0.146447, 0
    expected = [1.0, 0.8535534, 0.5, 0.1464466, 0.0]
    assert _lrs(lambda o: F.get_cosine_schedule_with_warmup(o, 0, 4), 5) == pytest.approx(expected, abs=1e-6)
    # min_lr_ratio 0.1 at s=2: 0.1 + 0.9*0.5 = 0.55; at s=4: 0.1
    with_floor = _lrs(lambda o: F.get_cosine_schedule_with_warmup(o, 0, 4, min_lr_ratio=0.1), 5)
    assert with_floor[2] == pytest.approx(0.55) and with_floor[4] == pytest.approx(0.1)
    # w=2, T=6: warm-up (s+1)/2 = 0.5, 1; then progress (s-2)/4: s=2 -> 1, s=4 -> 0.5
    warm = _lrs(lambda o: F.get_cosine_schedule_with_warmup(o, 2, 6), 5)
    assert warm == pytest.approx([0.5, 1.0, 1.0, 0.8535534, 0.5], abs=1e-6)
    verl_style = _lrs(lambda o: F.get_cosine_schedule_with_warmup(o, 2, 6, zero_lr_first_step=True), 3)
    assert verl_style == pytest.approx([0.0, 0.5, 1.0])


def test_schedules_reject_bad_arguments():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        F.get_cosine_schedule_with_warmup(optimizer, 0, 10, min_lr_ratio=1.5)
    with pytest.raises(ValueError, match="num_warmup_steps"):
        F.get_constant_schedule_with_warmup(optimizer, -1)
