"""exp_scripts/bench_memory.py: the batch it measures and its argument checks (the run itself needs GBs)."""
from __future__ import annotations

import os
import sys

import pytest

EXP = os.path.join(os.path.dirname(__file__), "..", "..", "exp_scripts")
if EXP not in sys.path:
    sys.path.insert(0, EXP)

import bench_memory  # noqa: E402


def test_batch_has_left_padded_prompts_right_padded_responses_and_the_asked_tokens():
    b = bench_memory.make_batch(rows=3, width=40, tokens=20, vocab=100)
    mask = b["attention_mask"]
    assert mask.shape == (3, 40) and (mask.sum(-1) == 20).all()
    assert (mask[:, :6] == 0).all() and (mask[:, 6:10] == 1).all()  # prompt: 20 // 5 = 4 tokens, left-padded
    assert (mask[:, 10:26] == 1).all() and (mask[:, 26:] == 0).all()  # response: 16 tokens, right-padded
    assert b["responses"].shape == b["advantages"].shape == (3, 30)
    assert (b["input_ids"][mask == 0] == 0).all() and (b["input_ids"][mask == 1] >= 3).all()
    assert (b["position_ids"][:, 6:26] == b["position_ids"].new_tensor(range(20))).all()


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        bench_memory.parse_args(["--tokens", "5000", "--width", "1024"])
    with pytest.raises(SystemExit):
        bench_memory.parse_args(["--chunk", "0"])
    args = bench_memory.parse_args([])
    assert (args.rows, args.width, args.tokens, args.chunk) == (4, 1024, 256, 1024)


def test_sp_rows_follow_the_plain_rows_and_sp_must_split_the_heads():
    assert bench_memory.phases(bench_memory.parse_args([])) == ["logprob", "update", "logprob-sp2", "update-sp2"]
    assert bench_memory.phases(bench_memory.parse_args(["--sp", "1"])) == ["logprob", "update"]
    with pytest.raises(SystemExit):
        bench_memory.parse_args(["--sp", "3"])  # 14 attention heads do not split over 3 ranks
    child = bench_memory._child_cmd(bench_memory.parse_args(["--sp", "2"]), "ours", "update-sp2")
    assert child[child.index("--sp") + 1] == "2" and child[child.index("--child") + 2] == "update-sp2"
