"""The driver's rollout-correction stage on a hand-made batch: weights and rejection act on the engine-sampled
(on-policy) tokens only, off-policy prefix / full-trace tokens keep weight 1 and stay in the loss mask; the trainer
forces the old-log-prob pass and sends the weights / rejected mask to the update."""

from __future__ import annotations

import math
import types

import pytest
import torch

from luffy_pool.config.sections import ConfigSections
from luffy_pool.methods import get_method
from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer
from luffy_pool.trainer.rollout_correction import apply_rollout_correction, bypass_old_log_probs, enabled
from verl.protocol import DataProto

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

RC = "algorithm.rollout_correction"
CALC = "actor_rollout_ref.rollout.calculate_log_probs"
PATHS = ["data.train_files=/d/t.parquet", "data.val_files=/d/v.parquet", "actor_rollout_ref.model.path=/m"]
L = 3


def _rc(rollout_is=None, rollout_rs=None, rollout_rs_threshold=None, threshold=2.0, batch_normalize=False):
    return types.SimpleNamespace(
        rollout_is=rollout_is,
        rollout_is_threshold=threshold,
        rollout_rs=rollout_rs,
        rollout_rs_threshold=rollout_rs_threshold,
        rollout_is_batch_normalize=batch_normalize,
        bypass_mode=False,
    )


def _batch():
    """Three rows, prompt width 2, response width 3. Row 0: on-policy, 3 tokens, ratios pi_old/pi_rollout
    [1, 4, 0.5]. Row 1: one prefix token then 1 generated token (ratio 1.5), then padding. Row 2: a full trace
    (every token a prefix token; the engine's log-probs are 0 there)."""
    ratios = torch.tensor([[1.0, 4.0, 0.5], [3.0, 1.5, 1.0], [1.0, 1.0, 1.0]])
    rollout = torch.log(torch.full((3, L), 0.25))
    rollout[1, 0] = 0.0
    rollout[1, 2] = 0.0
    rollout[2] = 0.0
    old = torch.log(torch.full((3, L), 0.25)) + ratios.log()
    response = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    tensors = {
        "attention_mask": torch.cat([torch.ones(3, 2, dtype=torch.long), response], dim=-1),
        "response_mask": response.clone(),
        "prefix_mask": torch.tensor([[False, False, False], [True, False, False], [True, True, True]]),
        "old_log_probs": old,
        "rollout_log_probs": rollout,
    }
    return DataProto.from_dict(tensors=tensors)


def test_token_weights_on_on_policy_tokens_only_by_hand():
    batch = _batch()
    metrics = apply_rollout_correction(batch, _rc(rollout_is="token"), L)
    w = batch.batch["rollout_is_weights"]
    # on-policy ratios [1, 4, 0.5] and [1.5] truncated at 2; prefix, padding and full-trace tokens 1
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 0.5], [1.0, 1.5, 1.0], [1.0, 1.0, 1.0]]), atol=1e-6)
    # metrics over the 4 on-policy tokens, before truncation
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((1 + 4 + 0.5 + 1.5) / 4, abs=1e-6)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(4.0, abs=1e-5)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.25)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(0.0)
    # KL(pi_rollout || pi_old), k1 = mean(log pi_rollout - log pi_old)
    assert metrics["rollout_corr/kl"] == pytest.approx(-(0 + math.log(4) + math.log(0.5) + math.log(1.5)) / 4, abs=1e-6)
    assert torch.equal(batch.batch["response_mask"], _batch().batch["response_mask"])  # no rejection asked


def test_sequence_weights_multiply_the_row_ratios():
    batch = _batch()
    apply_rollout_correction(batch, _rc(rollout_is="sequence", threshold=5.0), L)
    # row 0: 1 * 4 * 0.5 = 2 (under 5); row 1: only its generated token, 1.5
    expected = torch.tensor([[2.0, 2.0, 2.0], [1.0, 1.5, 1.0], [1.0, 1.0, 1.0]])
    assert torch.allclose(batch.batch["rollout_is_weights"], expected, atol=1e-5)


def test_batch_normalized_weights_average_one_over_the_on_policy_tokens_only():
    batch = _batch()
    metrics = apply_rollout_correction(batch, _rc(rollout_is="token", batch_normalize=True), L)
    # truncated on-policy weights [1, 2, 0.5] and [1.5] have mean 5 / 4; the off-policy and padding tokens keep 1
    expected = torch.tensor([[1.0 / 1.25, 2.0 / 1.25, 0.5 / 1.25], [1.0, 1.5 / 1.25, 1.0], [1.0, 1.0, 1.0]])
    assert torch.allclose(batch.batch["rollout_is_weights"], expected, atol=1e-6)
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.25, abs=1e-6)


def test_bypass_takes_the_engines_log_probs_and_marks_the_off_policy_tokens_unknown():
    batch = _batch()
    engine = batch.batch["rollout_log_probs"].clone()
    batch.pop(batch_keys=["old_log_probs"])
    bypass_old_log_probs(batch, L)
    old = batch.batch["old_log_probs"]
    lp = math.log(0.25)
    nan = float("nan")
    # row 0 on-policy; row 1: prefix token, one generated token, padding; row 2 a full trace
    expected = torch.tensor([[lp, lp, lp], [nan, lp, 0.0], [nan, nan, nan]])
    assert torch.allclose(old, expected, atol=1e-6, equal_nan=True)
    assert torch.equal(batch.batch["rollout_log_probs"], engine)  # the engine's own values are left as they are
    batch.pop(batch_keys=["rollout_log_probs"])
    with pytest.raises(ValueError, match="bypass_mode needs 'rollout_log_probs'.*calculate_log_probs=True"):
        bypass_old_log_probs(batch, L)


def test_rejection_removes_on_policy_tokens_only():
    batch = _batch()
    metrics = apply_rollout_correction(batch, _rc(rollout_rs="token_k1", rollout_rs_threshold=1.8), L)
    assert "rollout_is_weights" not in batch.batch.keys()
    # ratios inside [1/1.8, 1.8] stay: row 0 loses the 4 and the 0.5; the prefix token (ratio 3 against the
    # engine's meaningless 0) and the full trace stay in the loss
    assert batch.batch["response_mask"].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)


def test_a_batch_without_on_policy_tokens_gets_unit_weights_and_no_metrics():
    batch = _batch()
    batch.batch["prefix_mask"][:] = True
    assert (
        apply_rollout_correction(batch, _rc(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=2.0), L)
        == {}
    )
    assert torch.equal(batch.batch["rollout_is_weights"], torch.ones(3, L))  # exact: no on-policy token, constant 1s
    assert torch.equal(batch.batch["response_mask"], _batch().batch["response_mask"])


def test_missing_engine_log_probs_name_the_key():
    batch = _batch()
    batch.pop(batch_keys=["rollout_log_probs"])
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        apply_rollout_correction(batch, _rc(rollout_is="token"), L)


def _trainer(compose_config, *overrides):
    """A trainer shell with only what the recompute decision and the update keys read."""
    sections = ConfigSections.from_config(compose_config(PATHS + list(overrides)))
    trainer = object.__new__(MIXRayPPOTrainer)
    rc = sections.algorithm.rollout_correction
    trainer.sections, trainer.use_ref, trainer.hooks = sections, False, []
    trainer.method = get_method(sections.algorithm.method)
    trainer.n, trainer.world_size = sections.workers.rollout.n, 2
    trainer.rollout_correction = rc if enabled(rc) else None  # as __init__
    trainer.bypass_mode = rc.bypass_mode
    trainer.response_length = L
    return trainer


def test_the_trainer_forces_the_old_log_prob_pass_and_sends_the_correction(compose_config):
    single_mini = [
        "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.ref.use_ref=False",
    ]
    rows = 8
    plain = _trainer(compose_config, *single_mini)
    assert plain._recompute_old_log_prob(rows) is False  # auto: the update's first forward gives them
    corrected = _trainer(
        compose_config,
        *single_mini,
        f"{CALC}=True",
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_rs=token_k1",
        f"{RC}.rollout_rs_threshold=2.0",
    )
    assert corrected._recompute_old_log_prob(rows) is True
    batch = _batch()
    keys = corrected._update_keys(batch)
    assert "rollout_is_weights" in keys and "response_mask" in keys
    assert "rollout_is_weights" not in plain._update_keys(batch) and "response_mask" not in plain._update_keys(batch)


def test_bypass_mode_skips_the_old_log_prob_pass(compose_config):
    class NoPass:
        def compute_log_prob(self, batch):
            raise AssertionError("bypass_mode must not run the old-log-prob pass")

    trainer = _trainer(compose_config, f"{CALC}=True", f"{RC}.bypass_mode=True")
    trainer.wg = NoPass()
    batch = _batch()
    batch.pop(batch_keys=["old_log_probs"])
    timing = {}
    batch = trainer._log_probs(batch, timing)
    assert "old_log_prob" not in timing
    on_policy = ~batch.batch["prefix_mask"] & batch.batch["response_mask"].bool()
    # exact: bypass copies the engine's log-probs onto its own tokens (a selection, order-free)
    assert torch.equal(batch.batch["old_log_probs"][on_policy], batch.batch["rollout_log_probs"][on_policy])
    assert "old_log_probs" in trainer._update_keys(batch)
