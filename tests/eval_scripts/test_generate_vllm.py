"""eval_scripts/generate_vllm.py: LUFFY's CLI, grading of a hand-built output set, real runs on the tiny model."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from verl.utils.data_format import R1_SYSTEM_PROMPT, write_records
from eval_scripts import collect_results, generate_vllm
from eval_scripts.generate_vllm import build_parser, decoded_path, select_rows, summary_path

THINK_PROMPT = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_luffy_command_line_forms_parse():
    args = build_parser().parse_args(
        [
            "--model_path",
            "m",
            "--data_path=in.parquet",
            "--output_file",
            "o.jsonl",
            "--remove_system",
            "True",
            "--template",
            "own",
            "--add_oat_evaluate",
            "True",
            "--n=4",
            "--temperature",
            "0.6",
            "--no_split_think",
        ]
    )
    assert args.input_file == "in.parquet" and args.remove_system is True and args.add_oat_evaluate is True
    assert args.n == 4 and args.no_split_think is True and args.max_tokens == 8192 and args.top_p == 1.0
    assert (
        build_parser()
        .parse_args(["--model_path", "m", "--input_file", "i", "--output_file", "o", "--remove_system=False"])
        .remove_system
        is False
    )


def test_max_rows_is_global_or_per_source():
    rows = [{"data_source": s, "i": i} for i, s in enumerate("aaabbbcc")]
    assert [r["i"] for r in select_rows(rows, 2, per_source=False)] == [0, 1]
    assert [r["i"] for r in select_rows(rows, 2, per_source=True)] == [0, 1, 3, 4, 6, 7]
    assert select_rows(rows, None, per_source=True) == rows


def _eval_row(source, index, gt):
    return {
        "data_source": source,
        "prompt": [
            {"role": "system", "content": R1_SYSTEM_PROMPT},
            {"role": "user", "content": f"{source} problem {index}"},
        ],
        "ability": "math",
        "reward_model": {"ground_truth": gt, "style": "rule"},
        "extra_info": {"index": index, "split": "default"},
    }


def _right(answer):
    return f"Some reasoning.\n</think>\nThe answer is $\\boxed{{{answer}}}$."


# (row, [sample texts with n=2]) -- correctness known by construction.
HAND_GRADED = [
    (_eval_row("aime", 0, "204"), [_right("204"), _right("205")]),
    (_eval_row("aime", 0, "204"), [_right("240"), "no answer at all</think>"]),
    (_eval_row("aime", 1, "25"), [_right("25"), _right("25.0")]),
    (_eval_row("aime", 1, "25"), [_right("25"), "\\boxed{25} but the think block is never closed"]),
    (_eval_row("math", 0, "\\frac{14}{3}"), [_right("\\dfrac{14}{3}"), _right("14/4")]),
    (_eval_row("math", 1, "9"), [_right("8"), _right("-9")]),
    # Boxed and stated: every grader reads A (LUFFY's math-verify and OAT need the box, see
    # tests/deepscaler/rewards/test_luffy_grader_agreement.py; the rule grader reads the ANSWER line).
    (_eval_row("gpqa", 0, "A"), ["x</think>\nSo $\\boxed{A}$.\nANSWER: A", "x</think>\nANSWER: C"]),
]


def _write_decoded(out):
    """The decoded samples of HAND_GRADED, as a previous generation run would have left them."""
    with open(decoded_path(out), "w") as f:
        for i, (row, texts) in enumerate(HAND_GRADED):
            for j, text in enumerate(texts):
                f.write(
                    json.dumps(
                        {
                            "data_source": row["data_source"],
                            "index": row["extra_info"]["index"],
                            "row": i,
                            "sample": j,
                            "prompt": THINK_PROMPT,
                            "generated_text": text,
                            "ground_truth": row["reward_model"]["ground_truth"],
                            "finish_reason": "stop",
                            "num_tokens": 10,
                        }
                    )
                    + "\n"
                )


EXPECTED_CORRECT = [True, False, False, False, True, True, True, False, True, False, False, False, True, False]


@pytest.mark.parametrize("grader", ["math_verify", "rule", "both"])
def test_hand_graded_outputs_give_hand_computed_metrics(tmp_path, grader, capsys):
    src = write_records([row for row, _ in HAND_GRADED], str(tmp_path / "bench.parquet"))
    out = str(tmp_path / "out" / "ckpt.jsonl")
    os.makedirs(os.path.dirname(out))
    _write_decoded(out)
    generate_vllm.main(
        [
            "--model_path",
            "unused",
            "--input_file",
            src,
            "--output_file",
            out,
            "--n",
            "2",
            "--force_generate",
            "False",
            "--grader",
            grader,
        ]
    )
    graded = [json.loads(x) for x in open(out)]
    assert [g["correct"] for g in graded] == EXPECTED_CORRECT
    assert {g["grade_status"] for g in graded[6:8]} == {"no_think_close", "ok"}

    summary = json.load(open(summary_path(out)))
    aime, math_, gpqa = (summary["per_source"][s] for s in ("aime", "math", "gpqa"))
    # aime: problem 0 has 1/4 correct, problem 1 has 3/4 (2 replicated rows x n=2 each)
    assert aime["avg"] == 0.5 and aime["avg_label"] == "avg@4"
    assert aime["pass@1"] == pytest.approx(0.5)
    assert aime["pass@2"] == pytest.approx(((1 - 3 / 6) + 1.0) / 2)
    assert aime["pass@4"] == 1.0
    assert (math_["avg"], math_["pass@1"], math_["pass@2"]) == (0.25, 0.25, 0.5)
    assert (gpqa["avg"], gpqa["pass@1"], gpqa["pass@2"]) == (0.5, 0.5, 1.0)
    assert summary["accuracy"] == pytest.approx(6 / 14)
    assert summary["avg_acc"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)
    printed = capsys.readouterr().out
    assert "aime: 0.5\nmath: 0.25\ngpqa: 0.5\n" in printed and f"avg acc: {(0.5 + 0.25 + 0.5) / 3}" in printed

    # The table tool reads the same file and reports the same numbers in percent.
    header, rows = collect_results.build_table({"ckpt": collect_results.load_scores(out, "avg")})
    assert header == ["Model", "AIME24", "MATH-500", "Avg", "GPQA", "OOD Avg"]
    assert rows == [["ckpt", 0.5, 0.25, pytest.approx(0.375), 0.5, 0.5]]


def test_reusing_a_decoded_file_of_the_wrong_size_is_an_error(tmp_path, capsys):
    from verl.utils.data_format import run_cli

    src = write_records([row for row, _ in HAND_GRADED], str(tmp_path / "bench.parquet"))
    out = str(tmp_path / "o.jsonl")
    with open(decoded_path(out), "w") as f:
        f.write(json.dumps({"generated_text": "x"}) + "\n")
    code = run_cli(
        generate_vllm.main,
        ["--model_path", "m", "--input_file", src, "--output_file", out, "--force_generate", "False"],
    )
    assert code == 2 and "has 1 samples, expected 7" in capsys.readouterr().err


def test_hf_backend_generates_and_grades(tmp_path, tiny_model_dir, repo_data_dir):
    out = str(tmp_path / "hf.jsonl")
    summary = generate_vllm.run(
        build_parser().parse_args(
            [
                "--model_path",
                tiny_model_dir,
                "--input_file",
                os.path.join(repo_data_dir, "benchmarks", "valid.parquet"),
                "--output_file",
                out,
                "--backend",
                "hf",
                "--max_rows",
                "2",
                "--max_rows_per_source",
                "--n",
                "2",
                "--max_new_tokens",
                "8",
            ]
        )
    )
    assert summary["rows"] == 10 and summary["samples"] == 20
    assert set(summary["per_source"]) == {"aime", "math", "olympiad_bench", "amc", "minerva"}
    lines = [json.loads(x) for x in open(out)]
    assert all(0 < x["num_tokens"] <= 8 and x["prompt"].endswith("<think>\n") for x in lines)
    assert all("Your task is to follow" not in x["prompt"] for x in lines)  # system turn removed


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_on_60_benchmark_rows_then_collect_results(tmp_path, tiny_model_dir, repo_data_dir, capsys):
    # valid.all.parquet is the file with all six benchmarks (valid.parquet has no AIME25).
    src = os.path.join(repo_data_dir, "benchmarks", "valid.all.parquet")
    out = str(tmp_path / "evals" / "tiny.jsonl")
    summary = generate_vllm.run(
        build_parser().parse_args(
            [
                "--model_path",
                tiny_model_dir,
                "--input_file",
                src,
                "--output_file",
                out,
                "--max_rows",
                "10",
                "--max_rows_per_source",
                "True",
                "--max_new_tokens",
                "16",
                "--kv_cache_gb",
                "0.0625",
            ]
        )
    )
    sources = ["aime", "aime25", "amc", "math", "minerva", "olympiad_bench"]
    assert summary["rows"] == 60 and sorted(summary["per_source"]) == sources
    assert all(summary["per_source"][s]["num_samples"] == 10 for s in sources)
    assert os.path.exists(decoded_path(out)) and sum(1 for _ in open(out)) == 60
    expected_rows = pd.read_parquet(src).groupby("data_source", sort=False).head(10)
    graded = [json.loads(x) for x in open(out)]
    assert [g["ground_truth"] for g in graded] == [rm["ground_truth"] for rm in expected_rows.reward_model]

    capsys.readouterr()
    collect_results.main([os.path.dirname(out), "--out_dir", str(tmp_path / "table")])
    table = capsys.readouterr().out
    assert "| Model | AIME24 | AIME25 | AMC | MATH-500 | Minerva | Olympiad | Avg |" in table
    assert "| tiny |" in table
    with open(tmp_path / "table" / "benchmark_results.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_and_hf_backends_agree_greedily(tiny_model_dir):
    from verl.trainer.main_generation import SamplingArgs, generate_completions, load_generator

    prompts = [THINK_PROMPT, "What is 12 + 34?", "The answer is"]
    greedy = SamplingArgs(n=1, temperature=0.0, max_tokens=10)
    vllm_out = generate_completions(load_generator("vllm", tiny_model_dir, kv_cache_gb=0.0625), prompts, greedy)
    hf_out = generate_completions(load_generator("hf", tiny_model_dir), prompts, greedy)
    assert [c[0].token_ids for c in vllm_out] == [c[0].token_ids for c in hf_out]
    assert all(len(c[0].token_ids) == 10 for c in vllm_out)


@pytest.mark.parametrize(
    "flags,rule,expected_7,expected_12",
    [
        (["--add_oat_evaluate", "True"], "oat", True, True),
        (["--add_oat_evaluate", "True", "--any_true", "True"], "oat_any", True, True),
        (["--grader", "both"], "both", False, True),
    ],
)
def test_add_oat_evaluate_is_luffys_rule_and_both_the_stricter_one(tmp_path, flags, rule, expected_7, expected_12):
    """Sample 7 never closes its think block: LUFFY's OAT rule grades its whole text (right); ``both`` counts
    it wrong. Sample 12 boxes its letter: right under every rule."""
    src = write_records([row for row, _ in HAND_GRADED], str(tmp_path / "bench.parquet"))
    out = str(tmp_path / "ckpt.jsonl")
    _write_decoded(out)
    generate_vllm.main(
        [
            "--model_path",
            "unused",
            "--input_file",
            src,
            "--output_file",
            out,
            "--n",
            "2",
            "--force_generate",
            "False",
            *flags,
        ]
    )
    graded = [json.loads(x) for x in open(out)]
    expected = list(EXPECTED_CORRECT)
    expected[7], expected[12] = expected_7, expected_12
    assert [g["correct"] for g in graded] == expected
    assert {g["grader"] for g in graded} == {rule}
    summary = json.load(open(summary_path(out)))
    assert (
        summary["grader"] == rule and "OAT" in summary["grading_rule"]
        if rule != "both"
        else "stricter" in summary["grading_rule"]
    )
    if rule != "both":
        assert graded[7]["grade_status"] == "whole_text"


def test_any_true_without_add_oat_evaluate_changes_nothing_as_in_luffy(tmp_path, capsys):
    src = write_records([row for row, _ in HAND_GRADED], str(tmp_path / "bench.parquet"))
    graded = {}
    for name, flags in (("plain", []), ("any_true", ["--any_true", "True"])):
        out = str(tmp_path / f"{name}.jsonl")
        _write_decoded(out)
        generate_vllm.main(
            [
                "--model_path",
                "unused",
                "--input_file",
                src,
                "--output_file",
                out,
                "--n",
                "2",
                "--force_generate",
                "False",
                *flags,
            ]
        )
        graded[name] = [(g["correct"], g["grader"]) for g in map(json.loads, open(out))]
    assert graded["any_true"] == graded["plain"] and {g for _, g in graded["plain"]} == {"math_verify"}
    assert "--any_true without --add_oat_evaluate has no effect (as in LUFFY)" in capsys.readouterr().err


def test_max_tokens_other_than_luffys_8192_is_refused_naming_max_new_tokens(tmp_path):
    with pytest.raises(
        ValueError, match=r"--max_tokens 4096: LUFFY's generate_vllm.py ignores .* --max_new_tokens 4096"
    ):
        generate_vllm.run(
            build_parser().parse_args(
                [
                    "--model_path",
                    "m",
                    "--input_file",
                    "i",
                    "--output_file",
                    str(tmp_path / "o.jsonl"),
                    "--max_tokens",
                    "4096",
                ]
            )
        )
    args = build_parser().parse_args(
        [
            "--model_path",
            "m",
            "--input_file",
            "i",
            "--output_file",
            "o",
            "--max_tokens",
            "8192",
            "--max_new_tokens",
            "512",
        ]
    )
    assert (args.max_tokens, args.max_new_tokens) == (8192, 512)


def _fake_checkpoint(root):
    actor = root / "global_step_4" / "actor"
    (actor / "model").mkdir(parents=True)
    (actor / "model" / ".metadata").write_bytes(b"")
    return root / "global_step_4"


@pytest.mark.parametrize("given", ["step", "actor"])
def test_a_training_checkpoint_prints_the_exact_merger_command(tmp_path, capsys, given):
    from verl.utils.data_format import run_cli

    step = _fake_checkpoint(tmp_path)
    model = str(step if given == "step" else step / "actor")
    src = write_records([row for row, _ in HAND_GRADED], str(tmp_path / "bench.parquet"))
    code = run_cli(
        generate_vllm.main, ["--model_path", model, "--input_file", src, "--output_file", str(tmp_path / "o.jsonl")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert f"python -m verl.model_merger --ckpt {model} --out {os.path.abspath(model)}_hf" in err
    assert "--export_checkpoint True" in err


def test_export_checkpoint_merges_then_evaluates_the_export(tmp_path, monkeypatch):
    import verl.model_merger

    step = _fake_checkpoint(tmp_path)
    calls = []

    def merge(ckpt, out):  # the real merger is tested in tests/verl/test_model_merger.py
        calls.append((ckpt, out))
        os.makedirs(out)
        open(os.path.join(out, "config.json"), "w").write("{}")
        return out

    monkeypatch.setattr(verl.model_merger, "merge_checkpoint", merge)
    out = generate_vllm.resolve_model_path(str(step), export=True)
    assert calls == [(str(step), f"{step}_hf")] and out == f"{step}_hf"
    assert generate_vllm.resolve_model_path(str(step), export=False) == f"{step}_hf"  # reused, not re-exported
    assert len(calls) == 1


def test_overlong_prompts_are_skipped_and_counted_by_default():
    assert (
        build_parser().parse_args(["--model_path", "m", "--input_file", "i", "--output_file", "o"]).overlong_prompts
        == "skip"
    )
