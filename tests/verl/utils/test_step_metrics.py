"""StepMetrics: (value x tokens, tokens) per metric reduced once per step; hand-computed values."""

import pytest
import torch

from verl.utils import step_metrics
from verl.utils.step_metrics import StepMetrics, token_counts

# two micro-batches of 2 rows x 3 positions; row 0 of the first is off-policy on its first 2 tokens
MASK_A = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # 4 valid tokens
PREFIX_A = torch.tensor([[True, True, False], [False, False, False]])  # off 2, on 2; off rows' tokens 3, on rows' 1
MASK_B = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # 5 valid tokens, none off-policy
PREFIX_B = torch.zeros(2, 3, dtype=torch.bool)


def test_token_counts_of_each_set():
    assert token_counts(MASK_A, PREFIX_A) == {"valid": 4, "off": 2, "on": 2, "off_rows": 3, "on_rows": 1}
    assert token_counts(MASK_B, None) == {"valid": 5}


def test_token_weighted_means_over_the_step_and_the_optimizer_loss_per_step():
    s = StepMetrics("token_weighted", "luffy_token", grad_accum=2)
    s.add_micro_batch(
        {"actor/off_policy_prob": 0.9, "actor/on_policy_prob": 0.5, "actor/ppo_kl": 0.1, "actor/pg_loss": 0.4},
        MASK_A,
        PREFIX_A,
    )
    # no off-policy token: its off_policy_prob (a placeholder 0) must not pull the mean down
    s.add_micro_batch(
        {"actor/off_policy_prob": 0.0, "actor/on_policy_prob": 0.2, "actor/ppo_kl": 0.3, "actor/pg_loss": -0.2},
        MASK_B,
        PREFIX_B,
    )
    s.end_mini_batch(1.5)
    s.add_micro_batch(
        {"actor/off_policy_prob": 0.0, "actor/on_policy_prob": 0.4, "actor/ppo_kl": 0.0, "actor/pg_loss": 1.0},
        MASK_B,
        PREFIX_B,
    )
    s.end_mini_batch(2.5)
    out = s.result()
    assert out["actor/off_policy_prob"] == pytest.approx([0.9])  # off tokens: 2 in the first micro-batch only
    assert out["actor/on_policy_prob"] == pytest.approx([(0.5 * 2 + 0.2 * 5 + 0.4 * 5) / 12])
    assert out["actor/ppo_kl"] == pytest.approx([(0.1 * 4 + 0.3 * 5 + 0.0 * 5) / 14])
    # per optimizer step: Σ micro-batch loss / grad accum
    assert out["actor/pg_loss"] == pytest.approx([(0.4 - 0.2) / 2, 1.0 / 2])
    assert out["actor/grad_norm"] == [1.5, 2.5]


def test_sft_multitask_metrics_are_over_their_rows_tokens_and_unknown_metrics_over_valid_tokens():
    s = StepMetrics("token_weighted", "sft_multitask", grad_accum=1)
    s.add_micro_batch({"actor/sft_loss": 2.0, "actor/ppo_kl": 0.6, "actor/my_metric": 1.0}, MASK_A, PREFIX_A)
    s.add_micro_batch({"actor/sft_loss": 0.0, "actor/ppo_kl": 0.1, "actor/my_metric": 3.0}, MASK_B, PREFIX_B)
    s.end_mini_batch(0.0)
    out = s.result()
    assert out["actor/sft_loss"] == pytest.approx([2.0])  # off rows: 3 tokens, all in the first micro-batch
    assert out["actor/ppo_kl"] == pytest.approx([(0.6 * 1 + 0.1 * 5) / 6])  # on rows: 1 + 5 tokens
    assert out["actor/my_metric"] == pytest.approx([(1.0 * 4 + 3.0 * 5) / 9])


def test_a_metric_whose_tokens_never_occur_logs_0_and_micro_batch_mean_keeps_luffys_lists():
    s = StepMetrics("token_weighted", "luffy_token", grad_accum=1)
    s.add_micro_batch({"actor/off_policy_prob": 0.0}, MASK_B, PREFIX_B)
    s.end_mini_batch(1.0)
    assert s.result()["actor/off_policy_prob"] == [0.0]
    luffy = StepMetrics("micro_batch_mean", "luffy_token", grad_accum=2)
    luffy.add_micro_batch({"actor/off_policy_prob": 0.9, "actor/pg_loss": 0.4}, MASK_A, PREFIX_A)
    luffy.add_micro_batch({"actor/off_policy_prob": 0.0, "actor/pg_loss": -0.2}, MASK_B, PREFIX_B)
    luffy.end_mini_batch(1.5)
    assert luffy.result() == {
        "actor/off_policy_prob": [0.9, 0.0],
        "actor/pg_loss": [0.4, -0.2],
        "actor/grad_norm": [1.5],
    }


def test_unknown_aggregation_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"actor\.metric_aggregation='mean'.*token_weighted"):
        StepMetrics("mean", "vanilla", 1)


def test_several_ranks_reduce_sums_and_weights_then_divide(monkeypatch):
    """A 2-rank group (the collective faked): the other rank saw 3 off-policy tokens at p = 0.5 and an optimizer
    loss of 0.6: the step's value is the token mean over both ranks, the loss the mean of the ranks'."""
    other = {"actor/off_policy_prob": (1.5, 3.0)}
    monkeypatch.setattr(step_metrics, "_group_size", lambda group: 2)

    def all_reduce(buf, group=None):
        assert group == "dp"
        buf += torch.tensor([*other["actor/off_policy_prob"], 0.6], dtype=torch.float64)

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    monkeypatch.setattr("verl.utils.seqlen_balancing._collective_device", lambda group: "cpu")
    s = StepMetrics("token_weighted", "luffy_token", grad_accum=1)
    s.add_micro_batch({"actor/off_policy_prob": 0.9, "actor/pg_loss": 0.2}, MASK_A, PREFIX_A)
    s.end_mini_batch(1.0)
    out = s.result("dp")
    assert out["actor/off_policy_prob"] == pytest.approx([(0.9 * 2 + 1.5) / 5])
    assert out["actor/pg_loss"] == pytest.approx([(0.2 + 0.6) / 2])
    assert out["actor/grad_norm"] == [1.0]  # the global norm, the same on every rank
