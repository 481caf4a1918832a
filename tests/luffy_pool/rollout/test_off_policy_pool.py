"""Prefix-ratio schedules (docs/METHOD.md §1.2 table, §8 item 2) and the off-policy trace pool."""

from __future__ import annotations

import logging
import math
import zlib

import numpy as np
import pandas as pd
import pytest
import torch

from luffy_pool.rollout.off_policy_pool import (
    OffPolicyPool,
    PrefixRatioSampler,
    logprobs_from_target_probs,
    strip_right_padding,
)

from tests.helpers.sections import pool_of

PAD = 0


def sampler_of(seed: int = 0, **values):
    """The sampler of the YAML's rollout section with ``values`` set (every other key at its YAML default)."""
    from luffy_pool.config.compose import rollout_section

    return PrefixRatioSampler(rollout_section(**values), seed)


# ----------------------------------------------------------------------------------------------------
# PrefixRatioSampler
# ----------------------------------------------------------------------------------------------------
def test_luffy_default_gives_one_full_trace_slot_per_prompt():
    sampler = sampler_of(n=8, n_prefix=1, min_prefix_ratio=1.0, max_prefix_ratio=1.0)
    ratios = sampler.draw(batch_size=3, global_step=1)
    assert ratios.shape == (3, 8)
    assert ratios.tolist() == [[1.0] + [0.0] * 7] * 3
    assert ratios.mean() == 0.125  # batch/avg_prefix_ratio of the LUFFY run


def test_random_all_slots_are_iid_uniform_from_the_seeded_generator():
    sampler = sampler_of(n=4, n_prefix=-1, min_prefix_ratio=0.2, max_prefix_ratio=0.6, seed=5)
    ratios = sampler.draw(batch_size=2, global_step=7)
    expected = np.random.default_rng(5).uniform(0.2, 0.6, size=(2, 4))
    np.testing.assert_array_equal(ratios, expected)
    assert len(set(ratios.reshape(-1).tolist())) == 8


def test_random_first_k_slots_then_zeros():
    sampler = sampler_of(n=5, n_prefix=2, min_prefix_ratio=0.1, max_prefix_ratio=0.9, seed=3)
    ratios = sampler.draw(batch_size=4, global_step=1)
    np.testing.assert_array_equal(ratios[:, :2], np.random.default_rng(3).uniform(0.1, 0.9, size=(4, 2)))
    assert (ratios[:, 2:] == 0.0).all()


def test_n_prefix_zero_without_sharing_gives_no_prefix():
    sampler = sampler_of(n=4, n_prefix=0)
    assert (sampler.draw(3, 1) == 0.0).all()


def test_fixed_is_evenly_spaced_with_n_prefix_minus_one_denominator():
    all_slots = sampler_of(n=5, n_prefix=-1, min_prefix_ratio=0.0, max_prefix_ratio=1.0, prefix_strategy="fixed")
    assert all_slots.draw(2, 1).tolist() == [[0.0, 0.25, 0.5, 0.75, 1.0]] * 2
    three = sampler_of(n=6, n_prefix=3, min_prefix_ratio=0.2, max_prefix_ratio=0.8, prefix_strategy="fixed")
    np.testing.assert_allclose(three.draw(1, 1), [[0.2, 0.5, 0.8, 0.0, 0.0, 0.0]])
    one = sampler_of(n=3, n_prefix=1, min_prefix_ratio=0.4, max_prefix_ratio=0.9, prefix_strategy="fixed")
    assert one.draw(1, 1).tolist() == [[0.4, 0.0, 0.0]]  # LUFFY divides by zero here


@pytest.mark.parametrize(
    "global_step, expected",
    [(1, 0.8), (26, 0.8 * 0.75), (51, 0.4), (101, 0.0), (500, 0.0)],
)
def test_linear_shared_schedule_decays_to_zero_at_prefix_steps(global_step, expected):
    sampler = sampler_of(
        n=4,
        n_prefix=2,
        prefix_strategy="linear",
        prefix_share_across_samples=True,
        prefix_steps=100,
        prefix_linear_max_ratio=0.8,
    )
    ratios = sampler.draw(batch_size=2, global_step=global_step)
    np.testing.assert_allclose(ratios, [[expected, expected, 0.0, 0.0]] * 2)


@pytest.mark.parametrize("n_prefix", [0, -1])
def test_shared_ratio_goes_to_all_slots_when_n_prefix_not_positive(n_prefix):
    sampler = sampler_of(
        n=3, n_prefix=n_prefix, prefix_strategy="linear", prefix_share_across_samples=True, prefix_steps=10
    )
    np.testing.assert_allclose(sampler.draw(1, 6), [[0.4, 0.4, 0.4]])  # 0.8 * (1 - 5/10)


def test_shared_random_draws_one_ratio_per_prompt():
    sampler = sampler_of(
        n=4, n_prefix=3, min_prefix_ratio=0.3, max_prefix_ratio=0.7, prefix_share_across_samples=True, seed=9
    )
    ratios = sampler.draw(batch_size=3, global_step=1)
    per_prompt = np.random.default_rng(9).uniform(0.3, 0.7, size=3)
    np.testing.assert_array_equal(ratios[:, :3], np.repeat(per_prompt[:, None], 3, axis=1))
    assert (ratios[:, 3] == 0.0).all()


@pytest.mark.parametrize(
    "step, window",
    [(0, 0), (10, 0), (10.5, 1), (11, 1), (20, 1), (55, 5), (91, 9), (100, 9), (101, 9), (5000, 9)],
)
def test_window_index_boundaries_belong_to_the_earlier_window(step, window):
    sampler = sampler_of(n=2, prefix_strategy="linear_max", prefix_steps=100)
    assert sampler.window_index(step) == window


@pytest.mark.parametrize(
    "strategy, global_step, hi",
    [
        ("linear_max", 1, 0.8),  # step 0: window 0
        ("linear_max", 12, 0.72),  # step 11: window 1
        ("linear_max", 96, 0.08),  # step 95: window 9
        ("linear_max", 1001, 0.08),  # after prefix_steps: last window reused
        ("reverse_linear", 1, 0.08),
        ("reverse_linear", 12, 0.16),
        ("reverse_linear", 1001, 0.8),
    ],
)
def test_window_strategies_draw_uniform_below_the_window_bound(strategy, global_step, hi):
    sampler = sampler_of(
        n=4, n_prefix=-1, prefix_strategy=strategy, prefix_steps=100, prefix_linear_max_ratio=0.8, seed=2
    )
    assert sampler.window_upper_bound(global_step - 1) == pytest.approx(hi)
    ratios = sampler.draw(batch_size=5, global_step=global_step)
    np.testing.assert_allclose(ratios, np.random.default_rng(2).uniform(0.0, hi, size=(5, 4)))


def test_window_strategy_with_n_prefix_fills_first_slots_only():
    sampler = sampler_of(n=4, n_prefix=1, prefix_strategy="reverse_linear", prefix_steps=10, seed=1)
    ratios = sampler.draw(batch_size=3, global_step=2)  # step 1 -> window 0 -> U(0, 0.08)
    assert ((ratios[:, 0] >= 0) & (ratios[:, 0] <= 0.08)).all() and (ratios[:, 1:] == 0).all()


def test_state_dict_resume_reproduces_the_next_draws():
    sampler = sampler_of(n=3, seed=11)
    sampler.draw(2, 1)
    state = sampler.state_dict()
    expected = [sampler.draw(2, 2), sampler.draw(2, 3)]
    resumed = sampler_of(n=3, seed=999)
    resumed.load_state_dict(state)
    for step, want in zip((2, 3), expected):
        np.testing.assert_array_equal(resumed.draw(2, step), want)


def test_from_rollout_config_reads_luffy_keys(compose_config):
    from luffy_pool.config.sections import LuffyRolloutSection

    r = "actor_rollout_ref.rollout"
    cfg = compose_config(
        [
            f"{r}.n=8",
            f"{r}.n_prefix=1",
            f"{r}.min_prefix_ratio=1.0",
            f"{r}.max_prefix_ratio=1.0",
            f"{r}.prefix_strategy=random",
        ]
    )
    sampler = PrefixRatioSampler.from_rollout_config(
        LuffyRolloutSection.from_rollout_config(cfg.actor_rollout_ref.rollout), seed=4
    )
    # the keys not overridden take the YAML's values (prefix_steps 1000, prefix_linear_max_ratio 0.8)
    assert (sampler.n, sampler.n_prefix, sampler.prefix_steps, sampler.prefix_linear_max_ratio) == (8, 1, 1000, 0.8)
    assert (sampler.min_prefix_ratio, sampler.max_prefix_ratio, sampler.seed) == (1.0, 1.0, 4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["min_prefix_ratio=0.8", "max_prefix_ratio=0.2"], "min_prefix_ratio'=0.8 exceeds"),
        (["prefix_strategy=cosine"], "random, fixed, linear, linear_max, reverse_linear"),
        (["n_prefix=9"], "n_prefix'=9 must be -1 (all slots) or in [0, rollout.n=8]"),
        (["n_prefix=-2"], "n_prefix'=-2 must be -1"),
        (["prefix_strategy=linear"], "prefix_share_across_samples'=True"),
        (["prefix_steps=0"], "prefix_steps'=0"),
        (["max_prefix_ratio=1.5"], "max_prefix_ratio'=1.5"),
    ],
)
def test_invalid_prefix_config_is_refused_by_the_checker_with_the_key_named(compose_config, overrides, message):
    """The sampler holds no rules of its own: the config checker refuses these before any worker starts."""
    from luffy_pool.config.check import validate_config

    base = [
        "data.train_files=x",
        "data.val_files=null",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.rollout.n=8",
    ]
    errors = validate_config(compose_config(base + [f"actor_rollout_ref.rollout.{o}" for o in overrides]))
    assert len(errors) == 1 and message in errors[0], errors


def test_draw_rejects_step_zero():
    with pytest.raises(ValueError, match="from 1"):
        sampler_of(n=2).draw(1, 0)


# ----------------------------------------------------------------------------------------------------
# Trace helpers
# ----------------------------------------------------------------------------------------------------
def test_strip_right_padding_keeps_inner_pads():
    assert strip_right_padding([5, 0, 6, 0, 0], PAD) == [5, 0, 6]
    assert strip_right_padding([0, 0], PAD) == []


def test_logprobs_from_target_probs_marks_unknown_as_nan():
    out = logprobs_from_target_probs(torch.tensor([[0.5, 1.0, -1.0, 0.0]]))
    assert out[0, 0].item() == pytest.approx(math.log(0.5))
    assert out[0, 1].item() == 0.0 and math.isnan(out[0, 2].item()) and math.isnan(out[0, 3].item())


# ----------------------------------------------------------------------------------------------------
# OffPolicyPool
# ----------------------------------------------------------------------------------------------------
def _write(tmp_path, name, rows):
    path = str(tmp_path / name)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


@pytest.fixture
def extra_file(tmp_path):
    return _write(
        tmp_path,
        "extra.parquet",
        [
            {"index": 0, "trace": "a", "token_ids": [31, 32, 33], "logprobs": [-0.1, -0.2, -0.3, -0.4]},
            {"index": 0, "trace": "b", "token_ids": [41, 42], "logprobs": None},
            {"index": 7, "trace": "c", "token_ids": [51], "logprobs": [-1.0]},
            {"index": 99, "trace": "d", "token_ids": [61], "logprobs": None},
        ],
    )


def test_pool_loads_traces_and_counts_unmatched_prompt_ids(extra_file, caplog):
    with caplog.at_level(logging.WARNING, logger="luffy_pool.rollout.off_policy_pool"):
        pool = pool_of(extra_file, known_prompt_ids=[0, 1, 7])
    assert pool.num_extra_traces == 3
    assert pool.unmatched_trace_count == 1 and pool.unmatched_prompt_ids == [99]
    assert "1 extra trace(s) match no training prompt" in caplog.text
    assert [t.token_ids for t in pool.extra_traces_for(0)] == [[31, 32, 33], [41, 42]]
    assert pool.extra_traces_for(0)[0].logprobs == [-0.1, -0.2, -0.3, -0.4]
    assert pool.extra_traces_for(0)[1].source == "extra.parquet:1"


def test_pool_missing_column_names_file_and_column(tmp_path):
    path = _write(tmp_path, "bad.parquet", [{"index": 0, "text": "x"}])
    with pytest.raises(ValueError, match=r"bad\.parquet: missing column 'trace'"):
        pool_of(path, known_prompt_ids=[0])


def test_pool_logprob_length_mismatch_names_row_and_column(tmp_path):
    path = _write(
        tmp_path,
        "lp.parquet",
        [
            {"index": 0, "trace": "x", "token_ids": [1, 2], "logprobs": [-0.1, -0.2]},
            {"index": 0, "trace": "y", "token_ids": [1, 2], "logprobs": [-0.1, -0.1, -0.1, -0.1]},
        ],
    )
    with pytest.raises(ValueError, match=r"lp\.parquet: row 1: column 'logprobs' has 4 values for 2 trace tokens"):
        pool_of(path, known_prompt_ids=[0])


def test_pool_rejects_probabilities_in_the_logprobs_column(tmp_path):
    path = _write(tmp_path, "p.parquet", [{"index": 0, "trace": "x", "token_ids": [1], "logprobs": [0.7]}])
    with pytest.raises(ValueError, match="positive values"):
        pool_of(path, known_prompt_ids=[0])


def test_pool_without_token_ids_needs_a_tokenizer(tmp_path):
    path = _write(tmp_path, "t.parquet", [{"index": 0, "trace": "x"}])
    with pytest.raises(ValueError, match="pass tokenizer="):
        pool_of(path, known_prompt_ids=[0])


def test_pool_tokenizes_trace_text_and_strips_think(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = _write(tmp_path, "t.parquet", [{"index": 3, "trace": "<think>\n1 + 2 = 3.\n</think>\n\\boxed{3}"}])
    pool = pool_of(path, known_prompt_ids=[3], tokenizer=tok, strip_think_prefix=True)
    assert (
        pool.extra_traces_for(3)[0].token_ids
        == tok("1 + 2 = 3.\n</think>\n\\boxed{3}", add_special_tokens=False)["input_ids"]
    )


def test_extra_files_require_known_prompt_ids(extra_file):
    with pytest.raises(ValueError, match="known_prompt_ids"):
        pool_of(extra_file)


def test_slot_traces_without_extras_spreads_the_dataset_target_over_the_slots():
    pool = OffPolicyPool()
    tgt = torch.tensor([[5, 6, PAD], [PAD, PAD, PAD]])
    out = pool.slot_traces([0, 1], tgt, np.array([[1.0, 0.0], [1.0, 0.0]]), global_step=1, pad_token_id=PAD)
    assert out.tgt_input_ids.shape == (2, 2, 3)  # [B, n, T], as with extra files
    assert out.tgt_input_ids.tolist() == [[[5, 6, PAD]] * 2, [[PAD] * 3] * 2]
    assert out.tgt_input_ids.untyped_storage().data_ptr() == tgt.untyped_storage().data_ptr()  # a view, no n copies
    assert out.behaviour_log_probs is None and out.num_extra_slots == 0
    assert out.sources.tolist() == [["target", ""], ["", ""]]  # prompt 1 has an empty target


def test_slot_traces_without_extras_spreads_the_dataset_behaviour_log_probs_per_slot():
    tgt = torch.tensor([[5, 6, PAD]])
    lp = torch.tensor([[-0.5, -0.6, -0.7, float("nan")]], dtype=torch.float64)
    out = OffPolicyPool().slot_traces(
        [0], tgt, np.array([[1.0, 0.5, 0.0]]), global_step=1, pad_token_id=PAD, behaviour_log_probs=lp
    )
    assert out.behaviour_log_probs.shape == (1, 3, 4)  # [B, n, T + 1]
    for j in range(3):
        torch.testing.assert_close(out.behaviour_log_probs[0, j], lp[0], equal_nan=True)


def test_slot_traces_without_dataset_target_are_all_pad():
    pool = OffPolicyPool(use_dataset_target=False)
    lp = torch.zeros((1, 3))
    out = pool.slot_traces(
        [0], torch.tensor([[5, 6]]), np.array([[1.0, 0.0]]), global_step=1, pad_token_id=PAD, behaviour_log_probs=lp
    )
    assert out.tgt_input_ids.tolist() == [[[PAD, PAD]] * 2] and out.behaviour_log_probs is None
    assert out.sources.tolist() == [["", ""]]


def test_slot_traces_same_shape_and_values_with_or_without_extra_files(extra_file):
    """A prompt without extra traces gets the same slots whether or not the pool has extra files."""
    tgt = torch.tensor([[11, 12, PAD], [13, PAD, PAD]])
    lp = torch.tensor(
        [[-0.5, -0.6, -0.7, float("nan")], [-0.1, -0.2, float("nan"), float("nan")]]
    )  # float32, as the dataset's
    ratios = np.array([[1.0, 0.5, 0.0], [0.2, 0.0, 1.0]])
    plain = OffPolicyPool().slot_traces([5, 6], tgt, ratios, global_step=3, pad_token_id=PAD, behaviour_log_probs=lp)
    pooled = pool_of(extra_file, known_prompt_ids=[0, 5, 6]).slot_traces(
        [5, 6], tgt, ratios, global_step=3, pad_token_id=PAD, behaviour_log_probs=lp
    )  # extras are for prompt 0 only
    assert plain.tgt_input_ids.shape == pooled.tgt_input_ids.shape == (2, 3, 3)
    assert plain.behaviour_log_probs.shape == pooled.behaviour_log_probs.shape == (2, 3, 4)
    assert plain.behaviour_log_probs.dtype == pooled.behaviour_log_probs.dtype == torch.float64
    assert torch.equal(plain.tgt_input_ids, pooled.tgt_input_ids)
    torch.testing.assert_close(plain.behaviour_log_probs, pooled.behaviour_log_probs, equal_nan=True)
    assert plain.sources.tolist() == pooled.sources.tolist()


def test_slot_traces_reject_targets_that_are_not_b_by_t():
    with pytest.raises(ValueError, match=r"tgt_input_ids must be the dataset targets \[B, T\]"):
        OffPolicyPool().slot_traces(
            [0], torch.zeros((1, 2, 3), dtype=torch.long), np.ones((1, 2)), global_step=1, pad_token_id=PAD
        )


def test_slot_traces_target_first_then_extras_round_robin(extra_file):
    pool = pool_of(extra_file, known_prompt_ids=[0, 7], seed=1)
    tgt = torch.tensor([[11, 12, PAD, PAD], [13, PAD, PAD, PAD]])
    target_lp = torch.full((2, 5), float("nan"))
    target_lp[0, :3] = torch.tensor([-0.5, -0.6, -0.7])
    ratios = np.array([[1.0, 1.0, 1.0, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0]])
    out = pool.slot_traces([0, 1], tgt, ratios, global_step=4, pad_token_id=PAD, behaviour_log_probs=target_lp)
    assert out.tgt_input_ids.shape == (2, 5, 4)
    # Prompt 0: four prefix slots take [target, extra, extra] round-robin; slot 4 (ratio 0) keeps the target.
    order = np.random.default_rng([1, 4, zlib.crc32(repr(0).encode())]).permutation(2)
    extras = [[31, 32, 33, PAD], [41, 42, PAD, PAD]]
    names = ["extra.parquet:0", "extra.parquet:1"]
    assert out.tgt_input_ids[0, 0].tolist() == [11, 12, PAD, PAD]
    assert out.tgt_input_ids[0, 1].tolist() == extras[order[0]]
    assert out.tgt_input_ids[0, 2].tolist() == extras[order[1]]
    assert out.tgt_input_ids[0, 3].tolist() == [11, 12, PAD, PAD]
    assert out.tgt_input_ids[0, 4].tolist() == [11, 12, PAD, PAD]
    assert out.sources[0].tolist() == ["target", names[order[0]], names[order[1]], "target", ""]
    assert out.num_extra_slots == 2
    # Prompt 1 has no extras: its dataset target everywhere, "target" on the prefix slot only.
    assert all(out.tgt_input_ids[1, j].tolist() == [13, PAD, PAD, PAD] for j in range(5))
    assert out.sources[1].tolist() == ["target", "", "", "", ""]
    # Behaviour log-probs travel with the trace; extra 'b' has none (NaN), the target keeps its own.
    lp = out.behaviour_log_probs
    torch.testing.assert_close(lp[0, 0, :3], torch.tensor([-0.5, -0.6, -0.7], dtype=torch.float64))
    slot_of_a = 1 + list(order).index(0)
    torch.testing.assert_close(lp[0, slot_of_a, :4], torch.tensor([-0.1, -0.2, -0.3, -0.4], dtype=torch.float64))
    slot_of_b = 1 + list(order).index(1)
    assert torch.isnan(lp[0, slot_of_b]).all()


def test_slot_traces_are_reproducible_per_step(extra_file):
    pool = pool_of(extra_file, known_prompt_ids=[0], selection="shuffle", seed=3)
    tgt = torch.tensor([[11, PAD, PAD]])
    ratios = np.ones((1, 3))
    first = pool.slot_traces([0], tgt, ratios, global_step=2, pad_token_id=PAD)
    again = pool.slot_traces([0], tgt, ratios, global_step=2, pad_token_id=PAD)
    assert torch.equal(first.tgt_input_ids, again.tgt_input_ids)
    assert sorted(first.sources[0].tolist()) == ["extra.parquet:0", "extra.parquet:1", "target"]
    orders = {
        tuple(pool.slot_traces([0], tgt, ratios, global_step=s, pad_token_id=PAD).sources[0].tolist())
        for s in range(1, 30)
    }
    assert len(orders) > 1  # 'shuffle' rotates which trace comes first across steps


def test_extra_trace_longer_than_width_is_truncated_and_loses_its_eos_logprob(tmp_path):
    path = _write(
        tmp_path,
        "long.parquet",
        [{"index": 0, "trace": "x", "token_ids": [1, 2, 3, 4], "logprobs": [-1.0, -2.0, -3.0, -4.0, -5.0]}],
    )
    pool = pool_of(path, known_prompt_ids=[0], use_dataset_target=False)
    out = pool.slot_traces([0], torch.tensor([[9, PAD, PAD]]), np.array([[1.0]]), global_step=1, pad_token_id=PAD)
    assert out.tgt_input_ids[0, 0].tolist() == [1, 2, 3]
    assert out.behaviour_log_probs[0, 0, :3].tolist() == [-1.0, -2.0, -3.0] and math.isnan(
        out.behaviour_log_probs[0, 0, 3].item()
    )


@pytest.mark.parametrize(
    "row, message",
    [
        ({"token_ids": [1, 2], "logprobs": [-0.1, float("nan")]}, r"column 'logprobs': value 1 is (nan|None)"),
        ({"token_ids": [1, 2], "logprobs": [-0.1, float("-inf")]}, r"column 'logprobs': value 1 is -inf"),
        ({"token_ids": [1, -3], "logprobs": None}, r"column 'token_ids': token id -3 at position 1 is outside"),
        ({"token_ids": [[1, 2], [3]], "logprobs": None}, r"column 'token_ids': value 0 is a nested list"),
    ],
)
def test_pool_refuses_bad_values_naming_row_and_column(tmp_path, row, message):
    path = _write(tmp_path, "bad.parquet", [{"index": 0, "trace": "x", **row}])
    with pytest.raises(ValueError, match=r"bad\.parquet: row 0: " + message):
        pool_of(path, known_prompt_ids=[0])


def test_pool_refuses_token_ids_beyond_the_vocabulary(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = _write(tmp_path, "oov.parquet", [{"index": 0, "trace": "x", "token_ids": [1, 99999]}])
    with pytest.raises(
        ValueError,
        match=rf"oov\.parquet: row 0: column 'token_ids': token id 99999 at position 1 is "
        rf"outside the tokenizer's vocabulary \[0, {len(tok)}\)",
    ):
        pool_of(path, known_prompt_ids=[0], tokenizer=tok)
