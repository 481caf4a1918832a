"""data/prepare_train.py: GSM8K / OpenR1 / synthetic / formatted sources, LUFFY's filters, malformed input."""
from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from verl.utils.data_format import R1_SYSTEM_PROMPT, read_records, run_cli
from data.prepare_train import gsm8k_trace, main

TRAINING_SCHEMA = {
    "data_source": "string",
    "prompt": "list<element: struct<role: string, content: string>>",
    "target": "list<element: struct<role: string, content: string>>",
    "ability": "string",
    "reward_model": "struct<ground_truth: string, style: string>",
    "extra_info": "struct<index: int64, split: string>",
}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_trace_removes_calculator_notes_and_answer_line():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 1,000 more.\n#### 1,072"
    trace, gt = gsm8k_trace(solution)
    assert gt == "1072"
    assert trace == ("<think>\nNatalia sold 48/2 = 24 clips in May.\nShe sold 1,000 more.\n</think>\n"
                     "The answer is \\boxed{1072}.")


def test_gsm8k_first_50_rows_give_a_valid_training_parquet(tmp_path, repo_data_dir, tiny_model_dir):
    src = os.path.join(repo_data_dir, "gsm8k", "train.jsonl")
    out = str(tmp_path / "gsm8k.parquet")
    result = main(["--source", "gsm8k", "--input", src, "--output", out, "--max_rows", "50"])
    assert result["summary"]["read"] == 50 and result["summary"]["written"] == 50  # every GSM8K trace verifies
    schema = pq.read_schema(out)
    assert {f.name: str(f.type) for f in schema} == TRAINING_SCHEMA
    rows, raw = read_records(out), read_records(src, 50)
    for i, (row, orig) in enumerate(zip(rows, raw)):
        expected_gt = orig["answer"].split("####")[-1].strip().replace(",", "")
        assert row["data_source"] == "gsm8k" and row["ability"] == "math"
        assert row["reward_model"] == {"ground_truth": expected_gt, "style": "rule"}
        assert row["extra_info"] == {"index": i, "split": "train"}
        assert row["prompt"] == [{"role": "system", "content": R1_SYSTEM_PROMPT},
                                 {"role": "user", "content": orig["question"].strip()}]
        trace = row["target"][0]["content"]
        assert row["target"][0]["role"] == "assistant"
        assert trace.startswith("<think>\n") and trace.count("</think>") == 1
        assert trace.endswith(f"\n</think>\nThe answer is \\boxed{{{expected_gt}}}.")
        assert "<<" not in trace and "####" not in trace

    # The trainer's dataset reads it (tokenized target without the duplicated <think>\n).
    from transformers import AutoTokenizer

    from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ds = RLHFDatasetWithTarget(out, tok, max_prompt_length=1024, max_target_length=512)
    assert len(ds) == 50
    item = ds[0]
    target_ids = item["tgt_input_ids"][item["tgt_input_ids"] != tok.pad_token_id].tolist()
    assert tok.decode(target_ids).startswith("Natalia sold 48/2 = 24 clips")


def test_token_limit_drops_long_traces_and_counts_them(tmp_path, repo_data_dir, tiny_model_dir):
    from transformers import AutoTokenizer

    src = os.path.join(repo_data_dir, "gsm8k", "train.jsonl")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    traces = [gsm8k_trace(r["answer"])[0] for r in read_records(src, 30)]
    lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in traces]
    limit = sorted(lengths)[20]  # 9 or so traces are longer than this
    expected_long = sum(n > limit for n in lengths)
    out = str(tmp_path / "g.parquet")
    result = main(["--source", "gsm8k", "--input", src, "--output", out, "--max_rows", "30",
                   "--tokenizer", tiny_model_dir, "--max_trace_tokens", str(limit)])
    s = result["summary"]
    assert s["traces_dropped"] == {f"over {limit} tokens": expected_long}
    assert s["rows_dropped"] == {"no usable trace": expected_long} and s["written"] == 30 - expected_long
    assert all(len(tok(r["target"][0]["content"], add_special_tokens=False)["input_ids"]) <= limit
               for r in read_records(out))


def test_openr1_keeps_first_correct_trace_and_drops_rows_without_one(tmp_path, capsys):
    good = "<think>\nwork\n</think>\nSo the answer is $\\boxed{\\frac{1}{2}}$."
    rows = [
        {"problem": "P0", "generations": ["<think>\nx\n</think>\n\\boxed{3}", good], "answer": "0.5"},
        {"problem": "P1", "generations": ["no think block \\boxed{1}", "<think>\ny\n</think>\n\\boxed{2}"],
         "answer": "2"},
        {"problem": "P2", "generations": ["<think>\nz\n</think>\n\\boxed{7}"], "answer": "8"},
        {"problem": "P3", "generations": "<think>\nw\n</think>\n\\boxed{4}", "answer": "4"},  # a single string
        {"problem": "P4", "generations": [good], "answer": ""},  # a proof problem: nothing to verify against
    ]
    out = str(tmp_path / "o.parquet")
    result = main(["--source", "openr1", "--input", _jsonl(tmp_path / "in.jsonl", rows), "--output", out])
    s = result["summary"]
    assert s["read"] == 5 and s["written"] == 3
    assert s["rows_dropped"] == {"no usable trace": 1, "no answer to verify against": 1}
    assert s["traces_dropped"] == {"answer fails math_verify grading": 2, "no <think>...</think> block": 1}
    written = read_records(out)
    assert [r["prompt"][1]["content"] for r in written] == ["P0", "P1", "P3"]
    assert written[0]["target"][0]["content"] == good
    assert written[0]["data_source"] == "openr1"
    printed = capsys.readouterr().out
    assert "row dropped (no usable trace): 1" in printed
    assert "trace dropped (answer fails math_verify grading): 2" in printed


def test_split_name_labels_the_printed_output(tmp_path, capsys):
    out = str(tmp_path / "t.parquet")
    main(["--source", "synthetic", "--output", out, "--n_rows", "4", "--grader", "rule", "--split", "test"])
    printed = capsys.readouterr().out
    assert f"test: {out} (4 rows)" in printed and "train:" not in printed


def test_val_fraction_writes_a_problem_disjoint_val_file(tmp_path, repo_data_dir):
    out = str(tmp_path / "g.parquet")
    result = main(["--source", "gsm8k", "--input", os.path.join(repo_data_dir, "gsm8k", "train.jsonl"),
                   "--output", out, "--max_rows", "40", "--val_fraction", "0.25", "--no_system_prompt"])
    train, val = read_records(out), read_records(result["paths"]["val"])
    assert len(train) + len(val) == 40 and 3 <= len(val) <= 20
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in val}
    assert all(len(r["prompt"]) == 1 for r in train)
    assert [r["extra_info"] for r in val] == [{"index": i, "split": "val"} for i in range(len(val))]


def test_synthetic_source_and_formatted_round_trip(tmp_path):
    from luffy_pool.tiny.arith_task import SYSTEM_PROMPT

    out = str(tmp_path / "syn.parquet")
    result = main(["--source", "synthetic", "--output", out, "--n_rows", "12", "--grader", "rule"])
    assert result["summary"]["written"] == 12
    rows = read_records(out)
    assert rows[0]["data_source"] == "synthetic_arith" and rows[0]["prompt"][0]["content"] == SYSTEM_PROMPT
    # A formatted parquet passes through unchanged (prompt kept, re-verified).
    again = str(tmp_path / "again.parquet")
    main(["--source", "luffy", "--input", out, "--output", again])
    assert read_records(again) == rows


@pytest.mark.parametrize("case", ["missing_column", "bad_json", "non_list_prompt", "empty_target", "non_utf8",
                                  "nan_ground_truth"])
def test_malformed_input_gives_one_line_error_naming_file_row_and_column(case, tmp_path, capsys):
    good = {"question": "q", "answer": "x\n#### 1"}
    formatted = {"data_source": "d", "prompt": [{"role": "user", "content": "q"}],
                 "target": [{"role": "assistant", "content": "<think>\nx\n</think>\n\\boxed{1}"}],
                 "ability": "math", "reward_model": {"ground_truth": "1", "style": "rule"},
                 "extra_info": {"index": 0, "split": "train"}}
    if case == "missing_column":
        src, source = _jsonl(tmp_path / "in.jsonl", [good, {"question": "q2"}]), "gsm8k"
        expected = f"{src}: row 1, column 'answer': missing column"
    elif case == "bad_json":
        src, source = str(tmp_path / "in.jsonl"), "gsm8k"
        (tmp_path / "in.jsonl").write_text(json.dumps(good) + "\n" + '{"question": "q2", "answer": }\n')
        expected = f"{src}: line 2, row 1: invalid JSON at character"
    elif case == "non_list_prompt":
        src, source = _jsonl(tmp_path / "in.jsonl", [formatted, {**formatted, "prompt": "q"}]), "luffy"
        expected = f"{src}: row 1, column 'prompt': expected a list"
    elif case == "non_utf8":  # G15: was a UnicodeDecodeError traceback, rc 1
        src, source = str(tmp_path / "in.jsonl"), "gsm8k"
        (tmp_path / "in.jsonl").write_bytes(json.dumps(good).encode() + b'\n{"question": "q\xff\xfe", "answer": "#### 1"}\n')
        expected = f"{src}: line 2, row 1: not valid UTF-8 (byte 0xff"
    elif case == "nan_ground_truth":
        bad = {**formatted, "reward_model": {"ground_truth": "nan", "style": "rule"}}
        src, source = _jsonl(tmp_path / "in.jsonl", [formatted, bad]), "luffy"
        expected = f"{src}: row 1, column 'reward_model.ground_truth': ground truth 'nan' is NaN/infinite"
    else:
        empty = {**formatted, "target": [{"role": "assistant", "content": ""}]}
        src, source = _jsonl(tmp_path / "in.jsonl", [formatted, formatted, empty]), "luffy"
        expected = f"{src}: row 2, column 'target': empty text"
    code = run_cli(main, ["--source", source, "--input", src, "--output", str(tmp_path / "o.parquet")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: " + expected) and "\n" not in err


@pytest.mark.e2e
def test_gsm8k_parquet_trains_two_luffy_steps(repo_data_dir, tiny_model_dir, tmp_path, ray_session, compose_config,
                                              luffy_overrides):
    """prepare_train.py turns GSM8K into a training parquet that main_mix_ppo trains on for 2 steps."""
    import json

    from data.prepare_train import main as prepare_main
    from luffy_pool.run.launcher import build_trainer

    out = tmp_path / "gsm8k.parquet"
    prepare_main(["--source", "gsm8k", "--input", f"{repo_data_dir}/gsm8k/train.jsonl", "--output", str(out),
                  "--max_rows", "24", "--no_system_prompt"])
    overrides = luffy_overrides(tiny_model_dir, str(tmp_path), str(tmp_path / "run"), steps=2) + [
        f"data.train_files={out}", "data.val_files=null", "data.max_prompt_length=384", "trainer.test_freq=-1"]
    trainer, close = build_trainer(compose_config(overrides))
    try:
        last = trainer.fit()
    finally:
        close()
    assert last["training/global_step"] == 2
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["batch/avg_prefix_ratio"] == 0.25 for r in rows)


def _luffy_rows():
    """LUFFY-format rows with non-contiguous indices, an extra column, and one target whose answer is wrong."""
    rows = []
    for i, (index, answer, trace_answer) in enumerate([(17, "3", "3"), (4, "5", "6"), (90, "12", "12")]):
        rows.append({"data_source": "openr1", "prompt": [{"role": "system", "content": "S"},
                                                         {"role": "user", "content": f"q{i}"}],
                     "target": [{"role": "assistant", "content": f"<think>\nwork\n</think>\n\\boxed{{{trace_answer}}}"}],
                     "ability": "math", "reward_model": {"ground_truth": answer, "style": "rule"},
                     "extra_info": {"index": index, "split": "default"},
                     "target_ds_qwen_7b_probs": [0.5, 0.25]})
    return rows


def test_luffy_source_keeps_every_row_and_index_by_default(tmp_path):
    from verl.utils.data_format import write_records

    src = write_records(_luffy_rows(), str(tmp_path / "openr1.parquet"))
    out = str(tmp_path / "out" / "openr1.parquet")
    result = main(["--source", "luffy", "--input", src, "--output", out])
    assert read_records(out) == read_records(src)  # same rows, order, indices and extra column
    assert result["summary"] == {"read": 3, "written": 3, "would_drop": None, "dropped": 0}


def test_luffy_source_regrading_reports_what_it_would_drop(tmp_path):
    from verl.utils.data_format import write_records

    src = write_records(_luffy_rows(), str(tmp_path / "openr1.parquet"))
    out = str(tmp_path / "o.parquet")
    result = main(["--source", "luffy", "--input", src, "--output", out, "--verify", "True", "--grader", "rule"])
    assert result["summary"]["would_drop"] == 1 and result["summary"]["written"] == 3
    report = [json.loads(x) for x in open(result["paths"]["regrade_report"])]
    assert [(r["row"], r["index"]) for r in report] == [(1, 4)]
    dropped = main(["--source", "luffy", "--input", src, "--output", out, "--verify", "True", "--grader", "rule",
                    "--drop_failed", "True"])
    assert dropped["summary"]["dropped"] == 1
    assert [r["extra_info"]["index"] for r in read_records(out)] == [17, 90]  # kept rows keep LUFFY's indices


def test_luffy_source_writes_luffys_validation_parquets(tmp_path, repo_data_dir):
    from verl.utils.data_format import write_records

    src = write_records(_luffy_rows(), str(tmp_path / "openr1.parquet"))
    bench = os.path.join(repo_data_dir, "benchmarks")
    result = main(["--source", "luffy", "--input", src, "--output", str(tmp_path / "data" / "openr1.parquet"),
                   "--val_dir", bench])
    names = sorted(n for n in os.listdir(bench) if n.startswith("valid"))
    assert sorted(os.listdir(tmp_path / "data")) == sorted(names + ["openr1.parquet"])
    assert result["paths"]["valid.parquet"] == str(tmp_path / "data" / "valid.parquet")
    assert (tmp_path / "data" / "valid.parquet").read_bytes() == open(os.path.join(bench, "valid.parquet"), "rb").read()


def test_drop_failed_needs_luffy_source_with_verify(tmp_path):
    with pytest.raises(SystemExit, match="--drop_failed only acts"):
        main(["--source", "synthetic", "--output", str(tmp_path / "s.parquet"), "--drop_failed", "True"])
