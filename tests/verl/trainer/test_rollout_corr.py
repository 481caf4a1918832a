"""verl/trainer/ppo/rollout_corr.py: hand-computed weights, rejection masks and metrics, the config rule, and
equality with verl's own function on stored tensors (tests/data/verl_reference/rollout_corr_*.pt)."""

import glob
import math
import os

import pytest
import torch

from verl.trainer.ppo.rollout_corr import (
    CALCULATE_LOG_PROBS,
    config_errors,
    parse_rs_options,
    parse_rs_thresholds,
    rollout_correction,
)

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

LN = math.log
REF_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "data", "verl_reference")


def _token_case():
    """One row: ratios pi_old / pi_rollout = 3, 0.4, 1 and a padded 4th token (ratio 10, must not count)."""
    rollout = torch.full((1, 4), -1.0)
    old = rollout + torch.tensor([[LN(3.0), LN(0.4), 0.0, LN(10.0)]])
    return old, rollout, torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def test_token_is_truncates_at_threshold_and_reports_untruncated_stats():
    old, rollout, mask = _token_case()
    out = rollout_correction(old, rollout, mask, rollout_is="token", rollout_is_threshold=2.0)
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.4, 1.0, 0.0]]))
    assert not out.weights.requires_grad
    torch.testing.assert_close(out.response_mask, mask)  # no rejection asked
    m = out.metrics
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((3 + 0.4 + 1) / 3, rel=1e-6)  # before truncation
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(3.0, rel=1e-6)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.4, rel=1e-6)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)  # 3 > 2
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)  # 0.4 < 1/2
    # KL(pi_rollout || pi_old): k1 = mean(log pi_rollout - log pi_old), k3 = mean(r - 1 - log r).
    assert m["rollout_corr/kl"] == pytest.approx(-(LN(3) + LN(0.4)) / 3, rel=1e-5)
    assert m["rollout_corr/k3_kl"] == pytest.approx(((2 - LN(3)) + (-0.6 - LN(0.4))) / 3, rel=1e-5)
    assert m["rollout_corr/chi2_token"] == pytest.approx((9 + 0.16 + 1) / 3 - 1, rel=1e-5)


def test_sequence_is_is_the_truncated_product_over_the_row():
    rollout = torch.full((2, 3), -2.0)
    old = rollout + torch.tensor([[LN(2.0), LN(2.0), 0.0], [LN(0.25), 0.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = rollout_correction(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=2.0)
    # Row 0: 2 * 2 * 1 = 4 -> 2; row 1: 0.25 (the padded 5.0 is outside the product).
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 2.0, 2.0], [0.25, 0.25, 0.0]]))
    m = out.metrics
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((4 * 3 + 0.25 * 2) / 5, rel=1e-6)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(4.0, rel=1e-6)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.25, rel=1e-6)
    # exact: 1 of 2 sequences counted (order-free)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == 0.5  # per sequence
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == 0.5


def test_batch_normalize_makes_the_truncated_token_weights_average_one():
    old, rollout, mask = _token_case()
    out = rollout_correction(
        old, rollout, mask, rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True
    )
    # truncated [2, 0.4, 1] (padding 0) have mean 3.4 / 3 over the valid tokens; divided by it they average 1
    mean = 3.4 / 3
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.4, 1.0, 0.0]]) / mean)
    assert (out.weights * mask).sum().item() / 3 == pytest.approx(1.0, rel=1e-6)
    assert out.metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(mean, rel=1e-6)
    assert out.metrics["rollout_corr/rollout_is_mean"] == pytest.approx((3 + 0.4 + 1) / 3, rel=1e-6)  # before it


def test_batch_normalize_at_sequence_level_averages_over_sequences_not_tokens():
    rollout = torch.full((3, 3), -2.0)
    old = rollout + torch.tensor([[LN(2.0), LN(2.0), 0.0], [LN(0.5), 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 empty: not a sequence
    out = rollout_correction(
        old, rollout, mask, rollout_is="sequence", rollout_is_threshold=3.0, rollout_is_batch_normalize=True
    )
    # row weights: 4 -> 3 (truncated), 0.5; sequence mean (3 + 0.5) / 2 = 1.75 (a token mean would be 9.5 / 4)
    torch.testing.assert_close(out.weights, torch.tensor([[3.0, 3.0, 3.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]) / 1.75)
    assert out.metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.75, rel=1e-6)


def test_fill_unknown_old_log_probs_takes_the_current_ones_detached_where_nan_on_off_policy_tokens_only():
    from verl.trainer.ppo.rollout_corr import fill_unknown_old_log_probs

    old = torch.tensor([[-1.0, float("nan"), float("nan")]])
    log_prob = torch.tensor([[-0.5, -2.0, -3.0]], requires_grad=True)
    prefix = torch.tensor([[True, True, False]])
    filled = fill_unknown_old_log_probs(old, log_prob, prefix)
    # the off-policy NaN takes the current log-prob; an on-policy NaN is a fault and stays for the guard
    assert filled[0, :2].tolist() == [-1.0, -2.0] and torch.isnan(filled[0, 2]) and not filled.requires_grad
    assert torch.isnan(fill_unknown_old_log_probs(old, log_prob, None)[0, 1:]).all()


def test_token_k1_rejects_tokens_outside_the_ratio_bounds():
    old, rollout, mask = _token_case()
    out = rollout_correction(old, rollout, mask, rollout_rs="token_k1", rollout_rs_threshold=2.0)
    # k1 = log(pi_rollout / pi_old) = -ln3, ln2.5, 0 against [ln 0.5, ln 2]: only the third token stays.
    torch.testing.assert_close(out.response_mask, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
    assert out.weights is None
    assert out.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 3)
    assert out.metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 3)
    assert out.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0  # exact: 1 of 1 row (order-free)
    # Explicit bounds "lower_upper": [0.3, 3] keeps 1/3 and 2.5.
    wide = rollout_correction(old, rollout, mask, rollout_rs="token_k1", rollout_rs_threshold="0.3_3.0")
    torch.testing.assert_close(wide.response_mask, mask)


def test_sequence_rejection_drops_whole_rows_and_leaves_is_weights_alone():
    rollout = torch.full((2, 3), -1.0)
    log_ratio = torch.tensor([[0.2, -0.2, 0.4], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = rollout_correction(
        rollout + log_ratio,
        rollout,
        mask,
        rollout_is="token",
        rollout_is_threshold=5.0,
        rollout_rs="seq_sum_k2",
        rollout_rs_threshold=0.3,
    )
    # sum of log_ratio^2 / 2: row 0 = 0.12 (kept), row 1 = 0.5 (> 0.3, dropped).
    torch.testing.assert_close(out.response_mask, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(out.weights, torch.exp(log_ratio) * mask)  # weights on the unrejected mask
    m = out.metrics
    assert m["rollout_corr/rollout_rs_seq_sum_k2_mean"] == pytest.approx((0.12 * 3 + 0.5 * 2) / 5, rel=1e-5)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.5  # exact: 1 of 2 rows (order-free)


def test_every_option_must_pass():
    rollout = torch.zeros(1, 2)
    log_ratio = torch.tensor([[0.1, -0.9]])
    mask = torch.ones(1, 2)
    # token_k2: 0.005, 0.405 vs 0.5 keeps both; token_k3: e^-0.9 - 1 + 0.9 = 0.3066 > 0.3 drops the second.
    out = rollout_correction(
        rollout + log_ratio, rollout, mask, rollout_rs="token_k2, token_k3", rollout_rs_threshold="0.5,0.3"
    )
    torch.testing.assert_close(out.response_mask, torch.tensor([[1.0, 0.0]]))
    # exact: 0 and 1 of 2 tokens counted (order-free)
    assert out.metrics["rollout_corr/rollout_rs_token_k2_masked_fraction"] == 0.0
    assert out.metrics["rollout_corr/rollout_rs_token_k3_masked_fraction"] == 0.5


def test_bad_inputs_raise_one_line_errors():
    old, rollout, mask = _token_case()
    with pytest.raises(ValueError, match="one shape"):
        rollout_correction(old[:, :3], rollout, mask)
    with pytest.raises(ValueError, match="no token"):
        rollout_correction(old, rollout, torch.zeros_like(mask), rollout_is="token")
    with pytest.raises(ValueError, match="rollout_is='geometric'"):
        rollout_correction(old, rollout, mask, rollout_is="geometric")
    with pytest.raises(ValueError, match="'token_k4' is not one of"):
        parse_rs_options("token_k1,token_k4")
    with pytest.raises(ValueError, match="must be set"):
        parse_rs_thresholds(["token_k2"], None)
    with pytest.raises(ValueError, match="only k1 options"):
        parse_rs_thresholds(["token_k2"], "0.1_0.5")
    with pytest.raises(ValueError, match="2 entries for 3"):
        parse_rs_thresholds(["token_k2", "token_k3", "seq_max_k2"], "0.1,0.2")
    with pytest.raises(ValueError, match="must be > 0"):
        parse_rs_thresholds(["seq_mean_k1"], "0_2")
    assert parse_rs_thresholds(["seq_mean_k1", "seq_max_k3"], 4) == {
        "seq_mean_k1": (0.25, 4.0),
        "seq_max_k3": (None, 4.0),
    }


def _getter(**values):
    keys = {
        "rollout_is": "algorithm.rollout_correction.rollout_is",
        "rollout_rs": "algorithm.rollout_correction.rollout_rs",
        "rollout_rs_threshold": "algorithm.rollout_correction.rollout_rs_threshold",
        "rollout_is_batch_normalize": "algorithm.rollout_correction.rollout_is_batch_normalize",
        "calculate_log_probs": CALCULATE_LOG_PROBS,
    }
    flat = {keys[k]: v for k, v in values.items()}
    return flat.get


def test_config_rule_needs_calculate_log_probs_and_names_both_keys():
    assert config_errors(_getter(rollout_is=None, rollout_rs=None, calculate_log_probs=False)) == []
    assert config_errors(_getter(rollout_is="token", rollout_rs=None, calculate_log_probs=True)) == []
    errors = config_errors(_getter(rollout_is="token", rollout_rs=None, calculate_log_probs=False))
    assert len(errors) == 1
    assert "'algorithm.rollout_correction.rollout_is'='token'" in errors[0]
    assert f"'{CALCULATE_LOG_PROBS}'=True" in errors[0]
    errors = config_errors(
        _getter(rollout_is=None, rollout_rs="seq_max_k2", rollout_rs_threshold=None, calculate_log_probs=False)
    )
    assert len(errors) == 2 and "rollout_rs'='seq_max_k2' needs" in errors[0] and "must be set" in errors[1]
    errors = config_errors(_getter(rollout_is=None, rollout_is_batch_normalize=True, calculate_log_probs=True))
    assert errors == [
        "'algorithm.rollout_correction.rollout_is_batch_normalize'=True needs "
        "'algorithm.rollout_correction.rollout_is' (token or sequence): it normalises the IS weights"
    ]


REFERENCES = sorted(glob.glob(os.path.join(REF_DIR, "rollout_corr_*.pt")))
# The metrics this module reports (a subset of verl's, with verl's names): all must equal verl's values.
_IS_KEYS = {
    "rollout_is_mean",
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
}
_MISMATCH_KEYS = {"kl", "k3_kl", "chi2_token"}


def test_reference_files_are_present():
    assert len(REFERENCES) == 7, REFERENCES


@pytest.mark.parametrize("path", REFERENCES, ids=os.path.basename)
def test_equals_verl_on_stored_tensors(path):
    ref = torch.load(path)
    kw = ref["kwargs"]
    out = rollout_correction(ref["old_log_prob"], ref["rollout_log_prob"], ref["response_mask"], **kw)
    if ref["weights"] is None:
        assert out.weights is None
    else:
        torch.testing.assert_close(out.weights, ref["weights"], rtol=1e-6, atol=1e-6)
    # exact: a 0/1 mask (no statistic sits near its threshold: unchanged under 1e-5 relative noise)
    assert torch.equal(out.response_mask, ref["modified_response_mask"])
    expected = set(_MISMATCH_KEYS) | (_IS_KEYS if kw["rollout_is"] else set())
    if kw.get("rollout_is_batch_normalize"):
        expected.add("rollout_is_batch_norm_factor")
    if kw["rollout_rs"]:
        expected |= {"rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction"}
        for opt in parse_rs_options(kw["rollout_rs"]):
            expected |= {f"rollout_rs_{opt}_{s}" for s in ("mean", "masked_fraction", "seq_masked_fraction")}
    assert set(out.metrics) == {"rollout_corr/" + k for k in expected}
    for name, value in out.metrics.items():
        assert value == pytest.approx(ref["metrics"][name], rel=1e-6, abs=1e-6), name
