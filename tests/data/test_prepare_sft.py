"""data/prepare_sft.py and data/prepare_train_sft_rl.py: SFT format and the problem-disjoint SFT/RL split."""
from __future__ import annotations

import json

import pytest

from verl.utils.data_format import prompt_hash_fraction, read_records, run_cli, write_records
from data.prepare_sft import main as sft_main
from data.prepare_train_sft_rl import main as split_main
from data.prepare_train_sft_rl import split_sft_rl


def _row(i, question=None, trace=None):
    return {"data_source": "d",
            "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": question or f"Q{i}"}],
            "target": [{"role": "assistant", "content": trace or f"<think>\nwork {i}\n</think>\n\\boxed{{{i}}}"}],
            "ability": "math", "reward_model": {"ground_truth": str(i), "style": "rule"},
            "extra_info": {"index": i, "split": "train"}}


def test_sft_rows_strip_the_leading_think_and_keep_the_chat_prompt(tmp_path):
    src = write_records([_row(0), _row(1)], str(tmp_path / "t.parquet"))
    out = str(tmp_path / "sft.jsonl")
    sft_main(["--input", src, "--output", out])
    lines = [json.loads(x) for x in open(out)]
    assert lines[0] == {"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Q0"}],
                        "target": "work 0\n</think>\n\\boxed{0}", "data_source": "d"}
    sft_main(["--input", src, "--output", out, "--prompt_format", "question"])
    assert json.loads(open(out).readline())["prompt"] == "Q0"
    sft_main(["--input", src, "--output", out, "--no_system_prompt"])
    assert json.loads(open(out).readline())["prompt"] == [{"role": "user", "content": "Q0"}]


def test_sft_target_that_is_only_a_think_tag_is_an_error(tmp_path, capsys):
    src = write_records([_row(0), _row(1, trace="<think>\n")], str(tmp_path / "t.parquet"))
    assert run_cli(sft_main, ["--input", src, "--output", str(tmp_path / "o.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {src}: row 1, column 'target': target is empty after removing the leading <think>")


def test_split_is_problem_disjoint_and_follows_the_hash():
    rows = [_row(i) for i in range(200)] + [_row(7, question="Q7")]  # a duplicate problem
    sft, rl, excluded = split_sft_rl(rows, 0.3, seed=5)
    sft_q = [r["prompt"][1]["content"] for r in sft]
    rl_q = {r["prompt"][1]["content"] for r in rl}
    assert not set(sft_q) & rl_q and len(sft) + len(rl) == 201 and excluded == 0
    assert all(prompt_hash_fraction(q, 5) < 0.3 for q in sft_q)
    assert 40 <= len(sft) <= 80
    # Same seed, same split; another seed, another split.
    assert split_sft_rl(rows, 0.3, seed=5)[0] == sft
    assert split_sft_rl(rows, 0.3, seed=6)[0] != sft
    with pytest.raises(ValueError):
        split_sft_rl(rows, 1.0, seed=0)


def test_split_cli_writes_both_parts_and_honours_exclude(tmp_path):
    src = write_records([_row(i) for i in range(60)], str(tmp_path / "all.parquet"))
    rl_set = write_records([_row(i) for i in range(10)], str(tmp_path / "rl_main.parquet"))
    sft_out, rl_out = str(tmp_path / "sft.jsonl"), str(tmp_path / "rl.parquet")
    result = split_main(["--input", src, "--sft_output", sft_out, "--rl_output", rl_out, "--exclude", rl_set])
    sft = [json.loads(x) for x in open(sft_out)]
    rl = read_records(rl_out)
    assert result == {"sft": len(sft), "rl": len(rl), "excluded": 10} and len(sft) + len(rl) == 50
    sft_q = {s["prompt"][1]["content"] for s in sft}
    rl_q = {r["prompt"][1]["content"] for r in rl}
    assert not sft_q & rl_q and not (sft_q | rl_q) & {f"Q{i}" for i in range(10)}
    assert all(not s["target"].startswith("<think>") for s in sft)
    assert [r["extra_info"]["index"] for r in rl] == list(range(len(rl)))
