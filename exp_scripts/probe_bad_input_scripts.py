"""Probe cases for the eval and data-prep scripts (docs/DESIGN.md §3: G8, G14, G15): the eval graders on NaN and
infinite answers, the eval script's inputs and model folder, collect_results, and the data-prep scripts' inputs and
flags. Registered into ``probe_bad_input_cases.CASES`` when that module loads.
"""

from __future__ import annotations

import json
import os
from typing import Any

from exp_scripts.probe_bad_input import Context, Outcome, expect_cli_refusal
from exp_scripts.probe_bad_input_cases import case


# ------------------------------------------------------------------------------------ helpers
def _jsonl(ctx: Context, records: list[Any], name: str = "in.jsonl", raw: bytes | None = None) -> str:
    path = os.path.join(ctx.tmp(name.split(".")[0]), name)
    with open(path, "wb") as f:
        f.write(raw if raw is not None else b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return path


def _grade(text: str, gt: Any, grader: str) -> Outcome:
    from eval_scripts.grading import grade_text

    result = grade_text(text, gt, grader, True)
    if result.correct:
        return Outcome("bad", f"scored correct against ground truth {gt!r} ({grader})")
    return Outcome("good", f"not correct, status {result.status}")


# ------------------------------------------------------------------------------------ eval graders (G8)
def _nan_grade_case(cid: str, ref: str, text: str, gt: Any, grader: str):
    @case(cid, ref, f"eval grader {grader}: {text!r} vs ground truth {gt!r}")
    def _(ctx: Context) -> Outcome:
        return _grade(text, gt, grader)


_nan_grade_case("oat_nan_vs_nan", "G8", "x</think>\\boxed{nan}", "nan", "oat")
_nan_grade_case("oat_any_nan_vs_nan", "G8", "x</think>\\boxed{nan}", "nan", "oat_any")
_nan_grade_case("oat_inf_vs_inf", "G8", "x</think>\\boxed{inf}", "inf", "oat")
_nan_grade_case("math_verify_nan_vs_nan", "G8", "x</think>\\boxed{nan}", "nan", "math_verify")
_nan_grade_case("rule_nan_vs_float_nan", "G8", "x</think>\\boxed{nan}", float("nan"), "rule")


@case("oat_correct_answer_still_correct", "extra", "eval grader oat: a right answer stays right")
def _(ctx: Context) -> Outcome:
    from eval_scripts.grading import grade_text

    ok = grade_text("x</think>\\boxed{\\frac{1}{2}}", "0.5", "oat", True).correct
    return Outcome("good", "correct") if ok else Outcome("bad", "a right answer scored wrong")


# ------------------------------------------------------------------------------------ eval inputs and the checkpoint (G14)
def _bench_row(gt: Any = "3", **over) -> dict:
    row = {
        "data_source": "math",
        "prompt": [{"role": "user", "content": "What is 1 + 2?"}],
        "reward_model": {"ground_truth": gt},
        "extra_info": {"index": 0},
    }
    row.update(over)
    return row


def _eval(ctx: Context, input_file: str, *extra: str, model: str = "unused") -> Outcome:
    from eval_scripts import generate_vllm

    out = os.path.join(ctx.tmp("eval"), "o.jsonl")
    return lambda *names: expect_cli_refusal(
        generate_vllm.main, ["--model_path", model, "--input_file", input_file, "--output_file", out, *extra], *names
    )


@case("eval_on_checkpoint_folder", "G14", "eval --model_path global_step_N/actor (a training checkpoint)")
def _(ctx: Context) -> Outcome:
    actor = os.path.join(ctx.tmp("ckpt"), "global_step_4", "actor")
    os.makedirs(os.path.join(actor, "model"))
    open(os.path.join(actor, "model", ".metadata"), "wb").close()
    return _eval(ctx, _jsonl(ctx, [_bench_row()]), model=actor)("verl.model_merger", "global_step_4")


@case("eval_model_folder_missing", "extra", "eval --model_path that does not exist")
def _(ctx: Context) -> Outcome:
    return _eval(ctx, _jsonl(ctx, [_bench_row()]), model="/nonexistent/model")("/nonexistent/model")


@case("eval_input_nan_gt", "G8", "eval input: ground truth 'nan'")
def _(ctx: Context) -> Outcome:
    return _eval(ctx, _jsonl(ctx, [_bench_row(), _bench_row("nan")]))("in.jsonl", "row 1", "ground_truth")


@case("eval_input_dict_gt", "G7", "eval input: dict ground truth")
def _(ctx: Context) -> Outcome:
    return _eval(ctx, _jsonl(ctx, [_bench_row({"a": "3"})]))("in.jsonl", "row 0", "ground_truth")


@case("eval_input_missing_reward_model", "extra", "eval input without reward_model")
def _(ctx: Context) -> Outcome:
    row = {k: v for k, v in _bench_row().items() if k != "reward_model"}
    return _eval(ctx, _jsonl(ctx, [row]))("in.jsonl", "reward_model")


@case("eval_input_non_utf8", "extra", "eval input jsonl with invalid UTF-8")
def _(ctx: Context) -> Outcome:
    raw = json.dumps(_bench_row()).encode() + b"\n" + json.dumps(_bench_row()).encode().replace(b"1 + 2", b"1 \xff 2")
    return _eval(ctx, _jsonl(ctx, [], raw=raw))("in.jsonl", "UTF-8")


@case("eval_overlong_default_skips", "User", "eval: overlong benchmark prompts are skipped and counted by default")
def _(ctx: Context) -> Outcome:
    from eval_scripts.generate_vllm import build_parser

    mode = build_parser().parse_args(["--model_path", "m", "--input_file", "i", "--output_file", "o"]).overlong_prompts
    return Outcome("good", "default skip") if mode == "skip" else Outcome("weak", f"default {mode!r}: stops the eval")


@case("collect_results_empty_dir", "extra", "collect_results on a folder without results")
def _(ctx: Context) -> Outcome:
    from eval_scripts import collect_results

    return expect_cli_refusal(collect_results.main, [ctx.tmp("empty_evals")], "empty_evals")


# ------------------------------------------------------------------------------------ data-prep scripts (G15)
@case("prepare_train_non_utf8", "G15", "data/prepare_train.py on non-UTF-8 jsonl")
def _(ctx: Context) -> Outcome:
    from data.prepare_train import main

    src = _jsonl(ctx, [], raw=b'{"question": "q", "answer": "x\\n#### 1"}\n{"question": "q\xff", "answer": "#### 2"}\n')
    return expect_cli_refusal(
        main, ["--source", "gsm8k", "--input", src, "--output", src + ".parquet"], "in.jsonl", "line 2"
    )


@case("prepare_train_bad_json", "extra", "data/prepare_train.py on a broken JSON line")
def _(ctx: Context) -> Outcome:
    from data.prepare_train import main

    src = _jsonl(ctx, [], raw=b'{"question": "q", "answer": "x\\n#### 1"}\n{"question": \n')
    return expect_cli_refusal(
        main, ["--source", "gsm8k", "--input", src, "--output", src + ".parquet"], "in.jsonl", "line 2"
    )


@case("prepare_train_missing_input", "extra", "data/prepare_train.py on a missing file")
def _(ctx: Context) -> Outcome:
    from data.prepare_train import main

    return expect_cli_refusal(
        main,
        ["--source", "gsm8k", "--input", "/nonexistent/in.jsonl", "--output", os.path.join(ctx.tmp("o"), "o.parquet")],
        "/nonexistent/in.jsonl",
    )


@case("prepare_train_split_label", "User", "data/prepare_train.py --split test prints the split it wrote")
def _(ctx: Context) -> Outcome:
    import contextlib
    import io

    from data.prepare_train import main

    out = os.path.join(ctx.tmp("split"), "t.parquet")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        main(["--source", "synthetic", "--output", out, "--n_rows", "4", "--grader", "rule", "--split", "test"])
    text = buf.getvalue()
    return (
        Outcome("good", "prints 'test:'")
        if f"test: {out}" in text
        else Outcome("weak", f"prints {text.strip()[-80:]!r}")
    )


@case("prepare_sft_non_utf8", "G15", "data/prepare_sft.py on non-UTF-8 jsonl")
def _(ctx: Context) -> Outcome:
    from data.prepare_sft import main

    src = _jsonl(ctx, [], raw=b'{"a": "\xfe"}\n')
    return expect_cli_refusal(main, ["--input", src, "--output", src + ".parquet"], "in.jsonl", "UTF-8")


@case("prepare_off_policy_non_utf8", "G15", "data/prepare_off_policy.py on non-UTF-8 jsonl")
def _(ctx: Context) -> Outcome:
    from data.prepare_off_policy import main

    src = _jsonl(ctx, [], raw=b'{"index": "\xff"}\n')
    return expect_cli_refusal(main, [src, "--output", src + ".parquet"], "in.jsonl", "line 1")


@case("prepare_off_policy_neg_inf", "G11", "data/prepare_off_policy.py: a sample with -inf log-probs")
def _(ctx: Context) -> Outcome:
    from data.prepare_off_policy import main

    raw = (
        b'{"index": 0, "generated_text": "x", "finish_reason": "stop", "correct": true, "token_ids": [5, 6], '
        b'"logprobs": [-0.1, -Infinity]}\n'
    )
    src = _jsonl(ctx, [], raw=raw)
    return expect_cli_refusal(main, [src, "--output", src + ".parquet"], "in.jsonl", "logprobs")


@case("prepare_train_bad_val_fraction", "extra", "data/prepare_train.py --val_fraction 2 (exit 2 as data/README says)")
def _(ctx: Context) -> Outcome:
    from data.prepare_train import main

    return expect_cli_refusal(
        main,
        [
            "--source",
            "synthetic",
            "--output",
            os.path.join(ctx.tmp("o"), "o.parquet"),
            "--n_rows",
            "4",
            "--val_fraction",
            "2",
        ],
        "--val_fraction",
    )


@case("prepare_sft_rl_bad_fraction", "extra", "data/prepare_train_sft_rl.py --sft_fraction 2")
def _(ctx: Context) -> Outcome:
    from data.prepare_train_sft_rl import main

    out = ctx.tmp("o")
    return expect_cli_refusal(
        main,
        [
            "--input",
            os.path.join(ctx.task_dir, "train.parquet"),
            "--sft_output",
            os.path.join(out, "s.parquet"),
            "--rl_output",
            os.path.join(out, "r.parquet"),
            "--sft_fraction",
            "2",
        ],
        "--sft_fraction",
    )
