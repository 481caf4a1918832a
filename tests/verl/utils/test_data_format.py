"""Validation, reading and CLI helpers shared by the prepare and eval scripts (verl/utils/data_format.py)."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest

from verl.utils.data_format import (
    R1_SYSTEM_PROMPT,
    DataFormatError,
    add_bool_arg,
    check_chat,
    has_think_structure,
    prompt_hash_fraction,
    read_eval_table,
    read_records,
    sibling_path,
    strip_think_open,
    validate_training_row,
    write_records,
)


def _good_row(**over):
    row = {
        "data_source": "gsm8k",
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 1+1?"}],
        "target": [{"role": "assistant", "content": "<think>\n1+1=2\n</think>\n\\boxed{2}"}],
        "ability": "math",
        "reward_model": {"ground_truth": "2", "style": "rule"},
        "extra_info": {"index": 0, "split": "train"},
    }
    row.update(over)
    return row


def test_error_message_is_one_line_naming_file_row_and_column():
    err = DataFormatError("x.jsonl", "bad\nvalue\there", row=4, column="prompt", line=5)
    assert str(err) == "x.jsonl: line 5, row 4, column 'prompt': bad value here"
    assert "\n" not in str(err)


def test_bad_json_line_names_file_line_and_row(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"question": "a", "answer": "#### 1"}\n\n{"question": "b", "answer": \n')
    with pytest.raises(DataFormatError) as info:
        read_records(str(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}: line 3, row 1") and "invalid JSON" in msg and "\n" not in msg


def test_jsonl_line_that_is_not_an_object_is_rejected(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('[1, 2]\n')
    with pytest.raises(DataFormatError, match="row 0: expected a JSON object"):
        read_records(str(path))


def test_check_chat_accepts_numpy_arrays_from_pandas_and_rejects_strings():
    arr = np.array([{"role": "user", "content": "hi"}], dtype=object)
    assert check_chat(arr, "f", 0, "prompt") == [{"role": "user", "content": "hi"}]
    with pytest.raises(DataFormatError, match=r"^f: row 3, column 'prompt': expected a list of \{role, content\}"):
        check_chat("What is 1+1?", "f", 3, "prompt")
    with pytest.raises(DataFormatError, match="message 0 is not"):
        check_chat([{"role": "user"}], "f", 0, "prompt")


@pytest.mark.parametrize(
    "override, column, problem",
    [
        ({"prompt": "What is 1+1?"}, "prompt", "expected a list"),
        ({"target": []}, "target", "empty message list"),
        ({"target": [{"role": "assistant", "content": "  "}]}, "target", "empty text"),
        ({"reward_model": {"style": "rule"}}, "reward_model", "ground_truth"),
        ({"reward_model": {"ground_truth": "", "style": "rule"}}, "reward_model.ground_truth", "empty text"),
        ({"data_source": 3}, "data_source", "expected a string"),
    ],
)
def test_training_row_errors_name_the_column(override, column, problem):
    with pytest.raises(DataFormatError) as info:
        validate_training_row(_good_row(**override), "t.parquet", 7)
    assert str(info.value).startswith(f"t.parquet: row 7, column '{column}': ") and problem in str(info.value)


def test_training_row_missing_column_lists_the_present_ones():
    row = _good_row()
    del row["target"]
    with pytest.raises(DataFormatError, match=r"row 2, column 'target': missing column \(columns present: ability"):
        validate_training_row(row, "t.parquet", 2)


def test_numeric_ground_truth_becomes_a_string():
    assert validate_training_row(_good_row(reward_model={"ground_truth": 72}), "t", 0)["reward_model"] == {
        "ground_truth": "72",
        "style": "rule",
    }


def test_real_benchmark_parquet_validates(repo_data_dir):
    rows = read_eval_table(os.path.join(repo_data_dir, "benchmarks", "valid.parquet"))
    assert len(rows) == 2019
    assert {r["data_source"] for r in rows} == {"aime", "amc", "math", "minerva", "olympiad_bench"}
    assert rows[0]["ground_truth"] == "204" and rows[0]["index"] == 0 and rows[0]["row"] == 0
    # The system prompt in the real files is exactly the one prepare_train.py writes.
    assert rows[0]["prompt"][0] == {"role": "system", "content": R1_SYSTEM_PROMPT}


def test_parquet_round_trip_keeps_struct_columns(tmp_path):
    path = str(tmp_path / "t.parquet")
    write_records([_good_row(), _good_row(data_source="x")], path)
    back = read_records(path)
    assert back[0] == _good_row() and back[1]["data_source"] == "x"


def test_json_in_pandas_column_layout_is_read(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"q": {"0": "a", "1": "b"}, "n": {"0": 1, "1": 2}}))
    assert read_records(str(path)) == [{"q": "a", "n": 1}, {"q": "b", "n": 2}]


def test_prompt_hash_fraction_is_stable_and_roughly_uniform():
    assert prompt_hash_fraction("What is 1+1?", 0) == prompt_hash_fraction(" What is 1+1? ", 0)
    assert prompt_hash_fraction("What is 1+1?", 0) != prompt_hash_fraction("What is 1+1?", 1)
    values = [prompt_hash_fraction(f"problem {i}", 0) for i in range(2000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert 0.45 < sum(v < 0.5 for v in values) / len(values) < 0.55


def test_bool_flags_accept_fire_and_argparse_forms():
    ap = argparse.ArgumentParser()
    add_bool_arg(ap, "--remove_system", default=True, help="x")
    add_bool_arg(ap, "--flag", default=False, help="x")
    assert ap.parse_args([]).remove_system is True
    assert ap.parse_args(["--remove_system", "False"]).remove_system is False
    assert ap.parse_args(["--remove_system=false"]).remove_system is False
    assert ap.parse_args(["--flag"]).flag is True
    assert ap.parse_args(["--flag", "True"]).flag is True
    with pytest.raises(SystemExit):
        ap.parse_args(["--flag", "maybe"])


def test_think_helpers():
    assert has_think_structure("<think>\nx\n</think>\ny")
    assert not has_think_structure("x</think>") and not has_think_structure("<think>\nno close")
    assert strip_think_open("<think>\nabc") == "abc" and strip_think_open("abc") == "abc"
    assert sibling_path("out/train.parquet", "val") == "out/train.val.parquet"


def test_eval_table_refuses_unusable_ground_truths(tmp_path):
    for gt, message in (("nan", "ground truth 'nan' is NaN/infinite"), (" ", "empty text")):
        path = tmp_path / "bench.jsonl"
        path.write_text(
            json.dumps(
                {
                    "data_source": "math",
                    "prompt": [{"role": "user", "content": "q"}],
                    "reward_model": {"ground_truth": gt},
                }
            )
            + "\n"
        )
        with pytest.raises(
            DataFormatError, match=rf"bench\.jsonl: row 0, column 'reward_model.ground_truth': {message}"
        ):
            read_eval_table(str(path))


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
    with pytest.raises(DataFormatError, match=r"in\.jsonl: line 2, row 1: not valid UTF-8 \(byte 0xff"):
        read_records(str(path))


def test_run_cli_gives_exit_2_for_a_scripts_error_message(capsys):
    from verl.utils.data_format import run_cli

    def main(argv):
        raise SystemExit("error: --val_fraction must be in [0, 1), got 2.0")

    assert run_cli(main, []) == 2
    assert capsys.readouterr().err.strip() == "error: --val_fraction must be in [0, 1), got 2.0"
    with pytest.raises(SystemExit):  # argparse's own exit passes through
        run_cli(lambda argv: argparse.ArgumentParser().parse_args(["--nope"]), [])
