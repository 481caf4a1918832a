"""RLHFDataset (prompt-only, e.g. validation files): carried columns, index fallback, checks."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from verl.utils.dataset import RLHFDataset


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _rows(n, with_extra_info=True):
    rows = []
    for i in range(n):
        row = {
            "data_source": "aime" if i % 2 else "math",
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i} + 1?"}],
            "ability": "math",
            "reward_model": {"ground_truth": str(i + 1), "style": "rule"},
        }
        if with_extra_info:
            row["extra_info"] = {"index": 10 * i, "split": "default"}
        rows.append(row)
    return rows


def test_validation_file_without_target_loads_and_carries_columns(tokenizer, tmp_path):
    path = os.path.join(tmp_path, "valid.parquet")
    pd.DataFrame(_rows(3)).to_parquet(path)
    ds = RLHFDataset(path, tokenizer, max_prompt_length=48)
    row = ds[1]
    assert row["data_source"] == "aime" and row["reward_model"]["ground_truth"] == "2"
    assert row["index"] == 10 and ds.prompt_ids == [0, 10, 20]
    assert row["input_ids"].shape == (48,) and "prompt" not in row


def test_rows_without_extra_info_are_indexed_by_position(tokenizer, tmp_path):
    path = os.path.join(tmp_path, "noinfo.parquet")
    pd.DataFrame(_rows(2, with_extra_info=False)).to_parquet(path)
    ds = RLHFDataset(path, tokenizer, max_prompt_length=48)
    assert [ds[i]["index"] for i in range(2)] == [0, 1] and ds.prompt_ids == [0, 1]


def test_missing_reward_model_column_is_named(tokenizer, tmp_path):
    path = os.path.join(tmp_path, "nogt.parquet")
    pd.DataFrame([{k: v for k, v in r.items() if k != "reward_model"} for r in _rows(1)]).to_parquet(path)
    with pytest.raises(ValueError, match=r"nogt\.parquet: missing column 'reward_model'"):
        RLHFDataset(path, tokenizer)


def test_all_prompts_too_long_is_an_error_not_an_empty_dataset(tokenizer, tmp_path):
    path = os.path.join(tmp_path, "long.parquet")
    pd.DataFrame(_rows(2)).to_parquet(path)
    with pytest.raises(ValueError, match="no prompt of .* fits data.max_prompt_length=4"):
        RLHFDataset(path, tokenizer, max_prompt_length=4)


def test_unknown_truncation_lists_valid_values(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="valid: error, left, right"):
        RLHFDataset("x.parquet", tokenizer, truncation="middle")
