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
    with pytest.raises(SystemExit):
        bench_memory.parse_args(["--jobs", "0"])
    args = bench_memory.parse_args([])
    assert (args.rows, args.width, args.tokens, args.chunk) == (4, 1024, 256, 1024)


def test_sp_rows_follow_the_plain_rows_and_sp_must_split_the_heads():
    assert bench_memory.phases(bench_memory.parse_args([])) == ["logprob", "update", "logprob-sp2", "update-sp2"]
    assert bench_memory.phases(bench_memory.parse_args(["--sp", "1"])) == ["logprob", "update"]
    with pytest.raises(SystemExit):
        bench_memory.parse_args(["--sp", "3"])  # 14 attention heads do not split over 3 ranks
    child = bench_memory._child_cmd(bench_memory.parse_args(["--sp", "2"]), "ours", "update-sp2")
    assert child[child.index("--sp") + 1] == "2" and child[child.index("--child") + 2] == "update-sp2"


def test_prediction_covers_what_the_bench_measures_and_grows_with_tokens_and_layers():
    # The plan's lines for a one-process fp32 CPU actor, minus the resident weights and AdamW state.
    small = bench_memory.parse_args(["--rows", "2", "--width", "512", "--tokens", "256", "--chunk", "256"])
    wide = bench_memory.parse_args(["--rows", "2", "--width", "2048", "--tokens", "1024", "--chunk", "256"])
    deep = bench_memory.parse_args(
        ["--rows", "2", "--width", "512", "--tokens", "256", "--chunk", "256", "--layers", "4"]
    )
    for phase in bench_memory.PHASES:
        assert 0 < bench_memory.predicted_bytes(small, phase) < bench_memory.predicted_bytes(wide, phase)
    assert bench_memory.predicted_bytes(small, "update") < bench_memory.predicted_bytes(deep, "update")
    assert bench_memory.predicted_bytes(small, "logprob") < bench_memory.predicted_bytes(small, "update")
    ckpt = bench_memory.parse_args(
        ["--rows", "2", "--width", "2048", "--tokens", "1024", "--chunk", "256", "--layers", "4", "--checkpointing"]
    )
    assert bench_memory.predicted_bytes(ckpt, "update") < bench_memory.predicted_bytes(
        bench_memory.parse_args(
            ["--rows", "2", "--width", "2048", "--tokens", "1024", "--chunk", "256", "--layers", "4"]
        ),
        "update",
    )
    assert bench_memory.parse_sizes("2x512x256x2,4x1024x512x2") == [(2, 512, 256, 2), (4, 1024, 512, 2)]
    with pytest.raises(SystemExit):
        bench_memory.parse_sizes("2x512")


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--checkpointing"]], ids=["plain", "checkpointing"])
def test_memory_plan_predicts_the_measured_peaks_within_25_percent(extra):
    # the plan checked against measurement (peak RSS above resident, each phase in its own process),
    # at a small size: 2 rows x 512 positions, 256 real tokens each, 2 layers, the LM head in chunks of 256.
    # The two phase processes (one thread each) run at once: each measures its own peak.
    args = bench_memory.parse_args(
        [
            "--rows",
            "2",
            "--width",
            "512",
            "--tokens",
            "256",
            "--layers",
            "2",
            "--chunk",
            "256",
            "--threads",
            "1",
            *extra,
        ]
    )
    rows = bench_memory.measure_vs_predict(args, jobs=2)
    assert [row["phase"] for row in rows] == list(bench_memory.PHASES)
    for row in rows:
        assert abs(row["predicted"] / row["measured"] - 1) <= 0.25, row
