"""RLHFDatasetWithTarget (docs/METHOD.md §1.1): targets, <think> de-duplication, sampling, malformed rows."""

from __future__ import annotations

import copy
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch

from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget, collate_fn

TRACE = "<think>\n1 + 2 = 3.\n</think>\nThe answer is \\boxed{3}."


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _row(i, question="What is 1 + 2?", target=TRACE, **extra):
    row = {
        "data_source": "synthetic_arith",
        "prompt": [{"role": "user", "content": question}],
        "target": None if target is None else [{"role": "assistant", "content": target}],
        "ability": "math",
        "reward_model": {"ground_truth": "3", "style": "rule"},
        "extra_info": {"index": 100 + i, "split": "train"},
    }
    row.update(extra)
    return row


def _write(tmp_path, rows, name="train.parquet"):
    path = os.path.join(tmp_path, name)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tiny_task_rows_have_luffy_tensors(tokenizer, tiny_task_dir):
    ds = RLHFDatasetWithTarget(
        os.path.join(tiny_task_dir, "train.parquet"), tokenizer, max_prompt_length=256, max_target_length=128
    )
    assert len(ds) == 64 and ds.num_dropped_prompts == 0
    row = ds[0]
    assert row["input_ids"].shape == (256,) and row["tgt_input_ids"].shape == (128,)
    assert row["index"] == row["extra_info"]["index"] == 0
    assert set(row) >= {"attention_mask", "position_ids", "data_source", "ability", "reward_model", "extra_info"}
    assert "prompt" not in row and "target" not in row and "behaviour_log_probs" not in row


def test_prompt_is_left_padded_with_positions_from_the_mask(tokenizer, tmp_path):
    ds = RLHFDatasetWithTarget(_write(tmp_path, [_row(0)]), tokenizer, max_prompt_length=40, max_target_length=64)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 2?"}], add_generation_prompt=True, tokenize=False
    )
    ids = _ids(tokenizer, text)
    row = ds[0]
    pad = 40 - len(ids)
    assert row["input_ids"].tolist() == [tokenizer.pad_token_id] * pad + ids
    assert row["attention_mask"].tolist() == [0] * pad + [1] * len(ids)
    assert row["position_ids"].tolist() == [0] * pad + list(range(len(ids)))


def test_think_prefix_is_removed_when_the_template_opens_it(tokenizer, tmp_path):
    ds = RLHFDatasetWithTarget(_write(tmp_path, [_row(0)]), tokenizer, max_prompt_length=64, max_target_length=64)
    assert ds.generation_prompt_opens_think
    want = _ids(tokenizer, TRACE[len("<think>\n") :])
    pad = tokenizer.pad_token_id
    assert ds[0]["tgt_input_ids"].tolist() == want + [pad] * (64 - len(want))


def test_think_prefix_is_kept_when_the_template_does_not_open_it(tokenizer, tmp_path):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = tokenizer.chat_template.replace("<think>\n", "")
    ds = RLHFDatasetWithTarget(_write(tmp_path, [_row(0)]), plain, max_prompt_length=64, max_target_length=64)
    assert not ds.generation_prompt_opens_think
    want = _ids(plain, TRACE)
    assert ds[0]["tgt_input_ids"][: len(want)].tolist() == want


def test_target_is_truncated_to_max_target_length(tokenizer, tmp_path):
    ds = RLHFDatasetWithTarget(_write(tmp_path, [_row(0)]), tokenizer, max_prompt_length=64, max_target_length=5)
    assert ds[0]["tgt_input_ids"].tolist() == _ids(tokenizer, TRACE[len("<think>\n") :])[:5]


def test_overlong_prompts_are_dropped_and_counted(tokenizer, tmp_path, caplog):
    rows = [_row(0), _row(1, question="What is " + "9 + " * 40 + "1?"), _row(2)]
    with caplog.at_level("WARNING"):
        ds = RLHFDatasetWithTarget(_write(tmp_path, rows), tokenizer, max_prompt_length=40, max_target_length=16)
    assert len(ds) == 2 and ds.num_dropped_prompts == 1 and ds.num_rows_loaded == 3
    assert [ds[i]["index"] for i in range(2)] == [100, 102]
    assert ds.prompt_ids == [100, 102]
    assert "dropped 1 of 3 prompts longer than max_prompt_length=40" in caplog.text


def test_unfiltered_overlong_prompt_errors_or_truncates(tokenizer, tmp_path):
    path = _write(tmp_path, [_row(0, question="What is " + "9 + " * 40 + "1?")])
    # Refused at load, not when the sampler first draws the row.
    with pytest.raises(
        ValueError, match=r"train\.parquet: row 0: column 'prompt': prompt has \d+ tokens > data.max_prompt_length=40"
    ):
        RLHFDatasetWithTarget(
            path, tokenizer, max_prompt_length=40, max_target_length=16, filter_overlong_prompts=False
        )
    left = RLHFDatasetWithTarget(
        path, tokenizer, max_prompt_length=40, max_target_length=16, filter_overlong_prompts=False, truncation="left"
    )
    assert left[0]["attention_mask"].all()
    assert left[0]["input_ids"].tolist() == _ids(tokenizer, left._templated[0])[-40:]


def test_null_target_and_zero_sample_ratio_give_empty_targets(tokenizer, tmp_path):
    pad = tokenizer.pad_token_id
    ds = RLHFDatasetWithTarget(
        _write(tmp_path, [_row(0, target=None), _row(1)]), tokenizer, max_prompt_length=64, max_target_length=8
    )
    assert ds[0]["tgt_input_ids"].tolist() == [pad] * 8
    assert ds[1]["tgt_input_ids"][0].item() != pad
    never = RLHFDatasetWithTarget(
        _write(tmp_path, [_row(1)]), tokenizer, max_prompt_length=64, max_target_length=8, sample_target_ratio=0.0
    )
    assert never[0]["tgt_input_ids"].tolist() == [pad] * 8


def test_fixed_sample_target_mode_is_seeded_per_item(tokenizer, tmp_path):
    path = _write(tmp_path, [_row(i) for i in range(40)])
    make = lambda seed: RLHFDatasetWithTarget(
        path,
        tokenizer,
        max_prompt_length=64,
        max_target_length=8,
        sample_target_ratio=0.5,
        seed=seed,
        sample_target_mode="fixed",
    )
    ds, same, other = make(7), make(7), make(8)
    kept = [ds[i]["tgt_input_ids"][0].item() != tokenizer.pad_token_id for i in range(40)]
    assert kept == [bool(np.random.default_rng([7, i]).random() < 0.5) for i in range(40)]
    assert kept == [same[i]["tgt_input_ids"][0].item() != tokenizer.pad_token_id for i in range(40)]
    assert kept == [ds[i]["tgt_input_ids"][0].item() != tokenizer.pad_token_id for i in range(40)]  # every epoch
    assert kept != [other.keeps_target(i) for i in range(40)]
    assert 5 < sum(kept) < 35


def test_target_probs_column_becomes_log_probs_aligned_with_target_plus_eos(tokenizer, tmp_path):
    n = len(_ids(tokenizer, TRACE[len("<think>\n") :]))
    probs = [0.5] * n + [0.9]
    rows = [_row(0, target_ds_qwen_7b_probs=probs), _row(1, target_ds_qwen_7b_probs=None)]
    ds = RLHFDatasetWithTarget(_write(tmp_path, rows), tokenizer, max_prompt_length=64, max_target_length=n + 2)
    out = ds[0]["behaviour_log_probs"]
    assert out.shape == (n + 3,)
    assert out[: n + 1].tolist() == pytest.approx([math.log(0.5)] * n + [math.log(0.9)])
    assert torch.isnan(out[n + 1 :]).all() and torch.isnan(ds[1]["behaviour_log_probs"]).all()
    short = RLHFDatasetWithTarget(_write(tmp_path, rows[:1]), tokenizer, max_prompt_length=64, max_target_length=n - 1)
    cut = short[0]["behaviour_log_probs"]
    assert cut[: n - 1].tolist() == pytest.approx([math.log(0.5)] * (n - 1)) and torch.isnan(
        cut[n - 1]
    )  # no EOS after a cut


def test_target_probs_of_wrong_length_name_the_row(tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"train\.parquet: row 1: column 'target_ds_qwen_7b_probs' has 2 values"):
        RLHFDatasetWithTarget(
            _write(tmp_path, [_row(0), _row(1, target_ds_qwen_7b_probs=[0.5, 0.5])]),
            tokenizer,
            max_prompt_length=64,
            max_target_length=8,
        )


@pytest.mark.parametrize(
    "bad_row, message",
    [
        # Same column types as a good row, so the bad row can sit at row 1 of a valid parquet.
        (_row(1, prompt=[{"role": "user", "content": None}]), r"row 1: column 'prompt': message 0 must be"),
        (dict(_row(1), prompt=[]), r"row 1: column 'prompt': expected a non-empty list"),
        (dict(_row(1), target=[]), r"row 1: column 'target': expected a non-empty list"),
        (
            dict(_row(1), reward_model={"style": "rule", "ground_truth": None}),
            r"row 1: column 'reward_model': missing 'ground_truth'",
        ),
    ],
)
def test_malformed_rows_name_file_row_and_column(tokenizer, tmp_path, bad_row, message):
    path = _write(tmp_path, [_row(0), bad_row], name="bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet: " + message):
        RLHFDatasetWithTarget(path, tokenizer, max_prompt_length=64, max_target_length=8)


@pytest.mark.parametrize(
    "column, value, message",
    [
        (
            "prompt",
            "What is 1 + 2?",
            r"column 'prompt': expected a non-empty list of \{role, content\} messages, got str",
        ),
        ("target", "just text", r"column 'target': expected a non-empty list of messages or null"),
        ("target", [{"role": "assistant"}], r"column 'target': target\[0\] must be a dict with a 'content' string"),
    ],
)
def test_wrongly_typed_columns_name_file_row_and_column(tokenizer, tmp_path, column, value, message):
    path = _write(tmp_path, [dict(_row(0), **{column: value})], name="bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet: row 0: " + message):
        RLHFDatasetWithTarget(path, tokenizer, max_prompt_length=64, max_target_length=8)


def test_missing_target_column_names_file_and_column(tokenizer, tmp_path):
    path = _write(tmp_path, [{k: v for k, v in _row(0).items() if k != "target"}], name="val.parquet")
    with pytest.raises(ValueError, match=r"val\.parquet: missing column 'target'"):
        RLHFDatasetWithTarget(path, tokenizer, max_prompt_length=64, max_target_length=8)


def test_several_files_are_concatenated_and_errors_name_the_right_file(tokenizer, tmp_path):
    a = _write(tmp_path, [_row(0), _row(1)], name="a.parquet")
    n = len(_ids(tokenizer, TRACE[len("<think>\n") :]))
    b = _write(tmp_path, [_row(2, target_ds_qwen_7b_probs=[1.0] * (n + 1))], name="b.parquet")
    ds = RLHFDatasetWithTarget([a, b], tokenizer, max_prompt_length=64, max_target_length=8)
    assert len(ds) == 3 and ds.source_of(2).endswith("b.parquet: row 0")
    assert torch.isnan(ds[0]["behaviour_log_probs"]).all()  # a.parquet has no probs column
    bad = _write(tmp_path, [_row(2, target_ds_qwen_7b_probs=[1.0])], name="c.parquet")
    with pytest.raises(ValueError, match=r"c\.parquet: row 0: column 'target_ds_qwen_7b_probs'"):
        RLHFDatasetWithTarget([a, bad], tokenizer, max_prompt_length=64, max_target_length=8)


@pytest.mark.parametrize(
    "value, message",
    [
        (float("nan"), r"value 1 is (NaN|null)"),  # pandas writes NaN as null; both refused
        (None, r"value 1 is (NaN|null)"),
        (5.0, r"value 1 is 5\.0, outside \(0, 1\]"),
        (-0.7, r"value 1 is -0\.7, outside \(0, 1\].*log-probabilities"),
        (float("inf"), r"value 1 is inf, outside"),
    ],
)
def test_bad_target_probabilities_are_refused_at_load(tokenizer, tmp_path, value, message):
    n = len(_ids(tokenizer, TRACE[len("<think>\n") :]))
    probs = [0.5, value] + [0.5] * (n - 1)
    path = _write(tmp_path, [_row(0, target_ds_qwen_7b_probs=[0.5] * (n + 1)), _row(1, target_ds_qwen_7b_probs=probs)])
    with pytest.raises(ValueError, match=r"train\.parquet: row 1: column 'target_ds_qwen_7b_probs': " + message):
        RLHFDatasetWithTarget(path, tokenizer, max_prompt_length=64, max_target_length=8)


def test_minus_one_and_zero_are_unknown_probabilities(tokenizer, tmp_path):
    n = len(_ids(tokenizer, TRACE[len("<think>\n") :]))
    probs = [0.5, -1.0, 0.0] + [0.5] * (n - 2)
    ds = RLHFDatasetWithTarget(
        _write(tmp_path, [_row(0, target_ds_qwen_7b_probs=probs)]),
        tokenizer,
        max_prompt_length=64,
        max_target_length=n + 1,
    )
    out = ds[0]["behaviour_log_probs"]
    assert out[0].item() == pytest.approx(math.log(0.5)) and torch.isnan(out[1:3]).all()
    assert out[3].item() == pytest.approx(math.log(0.5))


@pytest.mark.parametrize(
    "ground_truth, message",
    [
        ({"answer": "3"}, r"ground_truth is a dict"),
        ("", r"ground_truth is empty"),
        ("   ", r"ground_truth is empty"),
        ("nan", r"ground_truth 'nan' is NaN/infinite"),
        (["3", ""], r"ground_truth item 1 is empty"),
    ],
)
def test_unusable_ground_truths_are_refused_at_load(tokenizer, tmp_path, ground_truth, message):
    # One row: a dict ground truth cannot share a parquet column with string ones.
    path = _write(
        tmp_path, [dict(_row(0), reward_model={"style": "rule", "ground_truth": ground_truth})], name="gt.parquet"
    )
    with pytest.raises(ValueError, match=r"gt\.parquet: row 0: column 'reward_model': " + message):
        RLHFDatasetWithTarget(path, tokenizer, max_prompt_length=64, max_target_length=8)


def test_collate_stacks_tensors_and_packs_the_rest(tokenizer, tiny_task_dir):
    ds = RLHFDatasetWithTarget(
        os.path.join(tiny_task_dir, "train.parquet"), tokenizer, max_prompt_length=256, max_target_length=64
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate_fn)
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (4, 256) and batch["tgt_input_ids"].shape == (4, 64)
    assert batch["reward_model"].dtype == object and batch["reward_model"].shape == (4,)
    assert batch["index"].tolist() == [0, 1, 2, 3]


# ---------------------------------------------------------------------- bad data fails loudly
def _long_rows():
    long_trace = "<think>\n" + "1 + 2 = 3. " * 30 + "\n</think>\nThe answer is \\boxed{3}."
    return [_row(0), _row(1, target=long_trace), _row(2, target=long_trace), _row(3, target=None)]


def test_long_traces_are_counted_at_load_with_one_warning_and_cut(tokenizer, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="luffy_pool.rollout.rl_dataset_with_target"):
        ds = RLHFDatasetWithTarget(
            _write(tmp_path, _long_rows()), tokenizer, max_prompt_length=64, max_target_length=24
        )
    warnings = [r.getMessage() for r in caplog.records if "longer than rollout.max_prefix_len" in r.getMessage()]
    assert (
        len(warnings) == 1
        and warnings[0].startswith("2 of 3 off-policy traces")
        and "truncate_off_policy=cut" in warnings[0]
    )
    assert ds.long_target_items == {1, 2}
    assert [bool(ds[i]["tgt_truncated"]) for i in range(4)] == [False, True, True, False]
    assert (ds[1]["tgt_input_ids"] != tokenizer.pad_token_id).sum() == 24
    batch = collate_fn([ds[i] for i in range(4)])
    assert int(batch["tgt_truncated"].sum()) == 2  # what the trainer logs as batch/off_policy_truncated


def test_long_traces_dropped_leave_the_prompt_without_a_trace(tokenizer, tmp_path):
    ds = RLHFDatasetWithTarget(
        _write(tmp_path, _long_rows()),
        tokenizer,
        max_prompt_length=64,
        max_target_length=24,
        truncate_off_policy="drop",
    )
    assert len(ds) == 4
    assert (ds[1]["tgt_input_ids"] == tokenizer.pad_token_id).all() and not bool(ds[1]["tgt_truncated"])
    assert (ds[0]["tgt_input_ids"] != tokenizer.pad_token_id).any()
    with pytest.raises(ValueError, match="truncate_off_policy must be one of"):
        RLHFDatasetWithTarget(_write(tmp_path, _long_rows()), tokenizer, max_target_length=24, truncate_off_policy="x")


NAN_MSG = "ground_truth .* is NaN/infinite"


# A float NaN inside the reward_model struct reads back from parquet as null: refused as missing.
@pytest.mark.parametrize(
    "gt,message",
    [
        (float("nan"), "missing 'ground_truth'"),
        (float("inf"), NAN_MSG),
        ("nan", NAN_MSG),
        (" NaN ", NAN_MSG),
        ("inf", NAN_MSG),
        ("-Infinity", NAN_MSG),
        (["3", "nan"], NAN_MSG),
    ],
)
def test_nan_or_inf_ground_truth_is_refused_at_load_naming_the_row(tokenizer, tmp_path, gt, message):
    good = 3.0 if isinstance(gt, float) else (["3"] if isinstance(gt, list) else "3")  # one parquet type per column
    rows = [
        _row(0, reward_model={"ground_truth": good, "style": "rule"}),
        _row(1, reward_model={"ground_truth": gt, "style": "rule"}),
    ]
    with pytest.raises(ValueError, match=r"train\.parquet: row 1: column 'reward_model': " + message):
        RLHFDatasetWithTarget(_write(tmp_path, rows), tokenizer, max_prompt_length=64, max_target_length=16)


def test_latex_infinity_is_a_valid_ground_truth(tokenizer, tmp_path):
    rows = [_row(0, reward_model={"ground_truth": "\\infty", "style": "rule"})]
    assert (
        len(RLHFDatasetWithTarget(_write(tmp_path, rows), tokenizer, max_prompt_length=64, max_target_length=16)) == 1
    )


@pytest.mark.parametrize("question", ["", "   \n"])
def test_empty_prompt_is_refused_with_its_own_message(tokenizer, tmp_path, question):
    rows = [_row(0), _row(1, question=question)]
    with pytest.raises(ValueError, match=r"train\.parquet: row 1: column 'prompt': the prompt is empty"):
        RLHFDatasetWithTarget(_write(tmp_path, rows), tokenizer, max_prompt_length=64, max_target_length=16)


def test_zero_row_file_and_non_parquet_file_have_their_own_messages(tokenizer, tmp_path):
    empty = _write(tmp_path, [_row(0)], name="empty.parquet")
    pd.read_parquet(empty).iloc[:0].to_parquet(empty)
    with pytest.raises(ValueError, match=r"empty\.parquet: the file has 0 rows"):
        RLHFDatasetWithTarget(empty, tokenizer, max_target_length=16)
    text = tmp_path / "notes.parquet"
    text.write_text("not parquet at all\n")
    with pytest.raises(ValueError, match=r"notes\.parquet: cannot read as parquet"):
        RLHFDatasetWithTarget(str(text), tokenizer, max_target_length=16)


def test_redraw_sample_target_mode_draws_again_on_every_read_as_luffy(tokenizer, tmp_path):
    # LUFFY's __getitem__: `np.random.rand() < sample_target_ratio` on each read, so over epochs a prompt
    # has its trace about ratio of the time, not always or never.
    path = _write(tmp_path, [_row(i) for i in range(12)])
    make = lambda: RLHFDatasetWithTarget(
        path, tokenizer, max_prompt_length=64, max_target_length=8, sample_target_ratio=0.5, seed=3
    )
    ds, again = make(), make()
    assert ds.sample_target_mode == "redraw"
    epochs = [[ds[i]["tgt_input_ids"][0].item() != tokenizer.pad_token_id for i in range(12)] for _ in range(20)]
    assert epochs == [
        [again[i]["tgt_input_ids"][0].item() != tokenizer.pad_token_id for i in range(12)] for _ in range(20)
    ]
    assert epochs[0] == [ds.keeps_target(i, 0) for i in range(12)] and epochs[5] == [
        ds.keeps_target(i, 5) for i in range(12)
    ]
    per_item = [sum(e[i] for e in epochs) for i in range(12)]
    assert all(0 < k < 20 for k in per_item), per_item  # each prompt: trace in some epochs, not in others
    assert 0.3 < sum(per_item) / 240 < 0.7


def test_redraw_follows_the_training_samplers_epoch_so_a_resume_draws_the_same(tokenizer, tmp_path):
    from types import SimpleNamespace

    path = _write(tmp_path, [_row(i) for i in range(12)])
    ds = RLHFDatasetWithTarget(
        path, tokenizer, max_prompt_length=64, max_target_length=8, sample_target_ratio=0.5, seed=3
    )
    sampler = SimpleNamespace(epoch=0)
    ds.use_epoch_of(sampler)
    kept = lambda: [ds[i]["tgt_input_ids"][0].item() != tokenizer.pad_token_id for i in range(12)]
    first = kept()
    assert first == kept() == [ds.keeps_target(i, 0) for i in range(12)]  # same epoch, same draws
    sampler.epoch = 4
    assert kept() == [ds.keeps_target(i, 4) for i in range(12)] != first


def test_sample_target_mode_is_checked(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="data.sample_target_mode must be one of"):
        RLHFDatasetWithTarget(
            _write(tmp_path, [_row(0)]), tokenizer, max_prompt_length=64, max_target_length=8, sample_target_mode="once"
        )
