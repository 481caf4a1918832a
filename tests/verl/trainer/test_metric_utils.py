"""Driver metrics: hand-computed values for data, group, timing and throughput metrics."""

import numpy as np
import pytest
import torch

from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_group_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reduce_metrics,
)


def _batch():
    # 3 rows, prompt width 2, response width 4; row 0 is off-policy (prefix on its first 3 tokens).
    attn = torch.tensor([[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    scores = torch.zeros(3, 4)
    scores[0, 2], scores[1, 3], scores[2, 0] = 1.0, 0.0, 1.0
    prefix = torch.zeros(3, 4, dtype=torch.bool)
    prefix[0, :3] = True
    adv = torch.tensor([[0.5, 0.5, 0.5, 0.0], [-1.0, -1.0, -1.0, -1.0], [0.25, 0.0, 0.0, 0.0]])
    return {
        "attention_mask": attn,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "advantages": adv,
        "returns": adv.clone(),
        "prefix_mask": prefix,
        "responses": torch.zeros(3, 4, dtype=torch.long),
    }


def test_data_metrics_split_on_and_off_policy_rows():
    m = compute_data_metrics(_batch(), response_length=4)
    # response lengths: row0 3, row1 4 (clipped at L), row2 1
    assert m["response_length/mean"] == pytest.approx(8 / 3)
    assert m["response_length/max"] == 4 and m["response_length/min"] == 1
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert m["prompt_length/mean"] == pytest.approx((2 + 1 + 2) / 3)
    assert m["prompt_length/clip_ratio"] == pytest.approx(2 / 3)  # LUFFY's: prompts filling the width 2
    assert m["critic/score/mean"] == pytest.approx(2 / 3)
    assert m["on_off_metrics/off_score"] == 1.0 and m["on_off_metrics/on_score"] == pytest.approx(0.5)
    assert m["on_off_metrics/off_response_length_mean"] == 3 and m["on_off_metrics/on_response_length_mean"] == 2.5
    assert m["on_off_metrics/off_on_example_ratio"] == pytest.approx(0.5)
    # advantages over valid response tokens only: 0.5*3, -1*4, 0.25 -> mean (1.5-4+0.25)/8
    assert m["critic/advantages/mean"] == pytest.approx(-2.25 / 8)
    assert m["critic/advantages/min"] == -1.0 and m["critic/advantages/max"] == 0.5


def test_group_metrics_count_groups_and_rows():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    uids = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    on = torch.tensor([False, True, True, True, True, True])
    m = compute_group_metrics(scores, uids, on)
    assert (m["batch/solve_none"], m["batch/solve_all"], m["batch/solve_none_format"]) == (1, 1, 0)  # LUFFY: counts
    assert m["batch/solve_none_frac"] == pytest.approx(1 / 3) and m["batch/solve_all_frac"] == pytest.approx(1 / 3)
    assert m["batch/solved"] == pytest.approx(0.5) and m["batch/failed"] == pytest.approx(0.5)
    assert m["batch/off_solved"] == 1.0 and m["batch/on_solved"] == pytest.approx(2 / 5)


def test_timing_and_throughput():
    t = compute_timing_metrics(
        {"gen": 2.0, "update_actor": 1.0, "step": 4.0}, num_prompt_tokens=100, num_response_tokens=400
    )
    assert t["timing_s/gen"] == 2.0 and t["timing_per_token_ms/gen"] == pytest.approx(5.0)
    assert t["timing_per_token_ms/update_actor"] == pytest.approx(2.0) and "timing_per_token_ms/step" not in t
    p = compute_throughput_metrics(total_tokens=1000, step_seconds=2.0, n_devices=2)
    assert p["perf/throughput"] == 250.0 and p["perf/time_per_step"] == 2.0


def test_reduce_metrics_means_lists():
    assert reduce_metrics({"a": [1, 2, 3], "b": [], "c": [0.5]}) == {"a": 2.0, "b": 0.0, "c": 0.5}


def test_flops_counter_follows_the_dense_transformer_count_and_mfu_needs_a_peak():
    from types import SimpleNamespace

    from verl.utils.flops_counter import FlopsCounter, device_peak_flops, update_flops_metrics

    cfg = SimpleNamespace(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
    )
    head_dim = 16
    dense = (64 * (4 * head_dim + 2 * 2 * head_dim + 4 * head_dim) + 3 * 64 * 128) * 2 + 2 * 100 * 64
    expected = 6 * dense * (10 + 30) + 12 * (10**2 + 30**2) * head_dim * 4 * 2
    assert FlopsCounter(cfg).step_flops([10, 30]) == expected
    assert FlopsCounter(SimpleNamespace(model_type="mamba")).step_flops([10]) == 0.0
    assert device_peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and device_peak_flops("cpu") is None
    m = update_flops_metrics(FlopsCounter(cfg, peak_flops=1e12), [10, 30], seconds=2.0, passes=2, share=0.5)
    assert m["mfu/actor"] == pytest.approx(expected / 2.0 * 2 * 0.5 / 1e12)
    assert m["perf/actor_tflops"] == pytest.approx(expected / 2.0 * 2 * 0.5 / 1e12)
    assert update_flops_metrics(FlopsCounter(cfg), [10], 1.0)["mfu/actor"] == 0.0  # CPU: no peak, as LUFFY's 0
