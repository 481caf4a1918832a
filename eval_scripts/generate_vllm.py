"""Offline evaluation: sample responses over a benchmark parquet, grade them, report per-source metrics.

LUFFY's command keeps working (``--model_path --input_file --output_file --remove_system True
--template own [--add_oat_evaluate True]``, docs/METHOD.md §4.4); ``--flag value``, ``--flag=value`` and
fire-style ``--flag True/False`` all parse. Flow: read and validate the parquet, render prompts (system
turn dropped by default), generate ``n`` samples per row with vLLM (CPU build or GPU, or ``--backend
hf``), write ``<output>.decoded.jsonl``, grade each sample (the text after ``</think>`` when the prompt
opened a think block; math-verify, the rule-based grader, or either; ``--add_oat_evaluate`` is LUFFY's OAT
rule, which grades the whole response when ``</think>`` is missing), then write ``<output>`` (one
line per sample), ``<output stem>.summary.json``, and print LUFFY's ``<data_source>: <acc>`` lines plus
pass@1, avg@k and unbiased pass@k per source. LUFFY's flags behave as in LUFFY or are refused naming the
replacement: its sampler hard-coded 8192 new tokens whatever ``--max_tokens`` said, so ``--max_tokens``
accepts only 8192 (``--max_new_tokens`` sets the budget); ``--any_true`` without ``--add_oat_evaluate``
changes nothing, as in LUFFY (a note says so).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Optional, Sequence

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:  # run as a file, or from another directory: `data`/`eval_scripts` live here
    sys.path.insert(0, _REPO_ROOT)

from verl.utils.data_format import DataFormatError, add_bool_arg, iter_jsonl, progress, read_eval_table, run_cli
from eval_scripts.grading import GRADERS, RULES, grade_samples
from eval_scripts.metrics import report_lines, summarize, summary_to_json
from verl.trainer.main_generation import (
    BACKENDS,
    TEMPLATES,
    SamplingArgs,
    generate_completions,
    load_generator,
    prepare_messages,
    render_prompt,
)

LUFFY_MAX_TOKENS = 8192  # LUFFY's generate_vllm passed max_tokens=8192 to SamplingParams, ignoring its flag


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python eval_scripts/generate_vllm.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--model_path", required=True, help="model folder (HF save_pretrained / exported checkpoint)")
    ap.add_argument("--input_file", "--data_path", dest="input_file", required=True, help="benchmark .parquet/.jsonl")
    ap.add_argument("--output_file", required=True, help="graded samples, .jsonl")
    ap.add_argument("--n", type=int, default=1, help="samples per row")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--top_k", type=int, default=-1, help="-1 = off")
    ap.add_argument(
        "--max_tokens",
        type=int,
        default=LUFFY_MAX_TOKENS,
        help="LUFFY's flag, which its script ignored (always 8192 new tokens): only 8192 is accepted; "
        "set another budget with --max_new_tokens",
    )
    ap.add_argument("--max_new_tokens", type=int, default=None, help="new tokens per sample (default 8192, LUFFY's)")
    add_bool_arg(ap, "--remove_system", default=True, help="drop the parquet's system turn (LUFFY's eval)")
    ap.add_argument("--system_prompt", default=None, help="system message to put in place of the parquet's")
    ap.add_argument(
        "--template",
        choices=list(TEMPLATES),
        default="own",
        help="own = the model's chat template; qwen/simplerl/prime = LUFFY's fixed templates; no = raw question",
    )
    add_bool_arg(
        ap,
        "--add_think_before_answer",
        default=False,
        help="grade as if the response started with <think>\\n even when the prompt does not open it",
    )
    add_bool_arg(ap, "--no_split_think", default=False, help="grade the whole response, not the part after </think>")
    ap.add_argument(
        "--grader",
        choices=GRADERS,
        default="math_verify",
        help="math_verify (LUFFY's default), rule (the deepscaler-style rule-based grader), both "
        "(correct if either says so; a response without </think> is wrong: stricter than LUFFY's "
        "OAT rule), oat / oat_any (LUFFY's --add_oat_evaluate [--any_true])",
    )
    add_bool_arg(
        ap,
        "--add_oat_evaluate",
        default=False,
        help="LUFFY's rule (= --grader oat): OAT's boxed grader on the text after </think>, or on the whole "
        "response when </think> is missing",
    )
    add_bool_arg(
        ap,
        "--any_true",
        default=False,
        help="with --add_oat_evaluate (LUFFY): math-verify after </think> OR the OAT label (= --grader oat_any)",
    )
    ap.add_argument("--grade_timeout", type=float, default=10.0, help="seconds per graded sample (LUFFY: 10)")
    ap.add_argument("--grader_workers", type=int, default=1, help="processes for grading (1 = in this process)")
    ap.add_argument("--max_rows", type=int, default=None, help="only the first K rows (see --max_rows_per_source)")
    add_bool_arg(ap, "--max_rows_per_source", default=False, help="apply --max_rows to each data_source")
    add_bool_arg(
        ap,
        "--force_generate",
        default=True,
        help="regenerate even when <output>.decoded.jsonl exists (False = reuse it and only grade)",
    )
    add_bool_arg(ap, "--skip_scoring", default=False, help="stop after writing the decoded samples")
    ap.add_argument("--backend", choices=BACKENDS, default="vllm")
    ap.add_argument("--tensor_parallel_size", type=int, default=None, help="GPUs per engine (default: all visible)")
    ap.add_argument("--gpu_memory_utilization", type=float, default=0.85)
    ap.add_argument("--dtype", default="auto", help="auto = bf16 on GPU, fp32 on CPU")
    ap.add_argument("--max_model_len", type=int, default=None, help="engine context (default: the model's)")
    ap.add_argument("--kv_cache_gb", type=float, default=None, help="KV cache GiB (CPU default 0.25)")
    ap.add_argument(
        "--hf_batch_size",
        type=int,
        default=16,
        help="prompts per HF decode batch (their n samples share one prompt prefill)",
    )
    ap.add_argument(
        "--overlong_prompts",
        choices=("error", "skip"),
        default="skip",
        help="a prompt longer than the context: grade it wrong and count it (skip), or stop (error)",
    )
    add_bool_arg(
        ap,
        "--export_checkpoint",
        default=False,
        help="--model_path may be a training checkpoint (run root, global_step_N or its actor/): export it "
        "to <checkpoint>_hf with verl.model_merger first (without this, the exact command is printed)",
    )
    ap.add_argument("--seed", type=int, default=0)
    add_bool_arg(
        ap,
        "--logprobs",
        default=False,
        help="also write each sample's generated token ids and their behaviour log-probs (the sampling "
        "distribution's); data/prepare_off_policy.py turns them into an off-policy trace file",
    )
    return ap


def select_rows(rows: list[dict], max_rows: Optional[int], per_source: bool) -> list[dict]:
    """The first ``max_rows`` rows overall, or of every data source (table order kept)."""
    if max_rows is None:
        return rows
    if not per_source:
        return rows[:max_rows]
    taken: collections.Counter = collections.Counter()
    out = []
    for row in rows:
        if taken[row["data_source"]] < max_rows:
            taken[row["data_source"]] += 1
            out.append(row)
    return out


def decoded_path(output_file: str) -> str:
    return (output_file[: -len(".jsonl")] if output_file.endswith(".jsonl") else output_file) + ".decoded.jsonl"


def summary_path(output_file: str) -> str:
    return (output_file[: -len(".jsonl")] if output_file.endswith(".jsonl") else output_file) + ".summary.json"


def _write_jsonl(records: Sequence[dict], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def _is_hf_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def checkpoint_export_dir(model_path: str) -> str:
    """Where ``--export_checkpoint`` (and the printed merger command) puts a checkpoint's HF folder."""
    return os.path.abspath(model_path).rstrip(os.sep) + "_hf"


def resolve_model_path(model_path: str, export: bool) -> str:
    """An HF model folder for ``model_path``: itself, or the export of a training checkpoint.

    A training checkpoint (sharded DCP weights, no top-level config.json) cannot be loaded by vLLM or
    transformers; without ``export`` this is one error line with the exact ``verl.model_merger`` command.
    """
    if not os.path.isdir(model_path):
        raise DataFormatError(model_path, "model folder not found")
    if _is_hf_folder(model_path):
        return model_path
    from verl.utils.checkpoint import layout

    try:
        actor_dir = layout.resolve_actor_dir(model_path)
    except FileNotFoundError:
        raise DataFormatError(model_path, "not a model folder (no config.json) and not a training checkpoint") from None
    if not layout.has_sharded_model(actor_dir):
        raise DataFormatError(model_path, f"training checkpoint without sharded weights ({actor_dir}/model/)")
    out = checkpoint_export_dir(model_path)
    command = f"python -m verl.model_merger --ckpt {model_path} --out {out}"
    if _is_hf_folder(out):
        print(f"using {out}, the export of training checkpoint {model_path}")
        return out
    if not export:
        raise DataFormatError(
            model_path,
            f"a training checkpoint, not a HF model folder; export it first: {command} "
            f"(then --model_path {out}), or pass --export_checkpoint True",
        )
    from verl.model_merger import merge_checkpoint

    print(f"exporting training checkpoint {model_path} -> {out} ({command})")
    return merge_checkpoint(model_path, out)


def generate_samples(args, rows: list[dict]) -> list[dict]:
    """One record per (row, sample): the rendered prompt, the generated text and generation stats."""
    generator = load_generator(
        args.backend,
        args.model_path,
        dtype=args.dtype,
        seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        kv_cache_gb=args.kv_cache_gb,
        gpu_memory_utilization=args.gpu_memory_utilization,
        batch_size=args.hf_batch_size,
    )
    prompts = [
        render_prompt(
            prepare_messages(r["prompt"], args.remove_system, args.system_prompt), args.template, generator.tokenizer
        )
        for r in rows
    ]
    print("example prompt:", repr(prompts[0][:2000]))
    sampling = SamplingArgs(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        logprobs=args.logprobs,
    )
    completions = generate_completions(generator, prompts, sampling, args.overlong_prompts)
    samples = []
    for row, prompt, comps in zip(rows, prompts, completions):
        for j, comp in enumerate(comps):
            samples.append(
                {
                    "data_source": row["data_source"],
                    "index": row["index"],
                    "row": row["row"],
                    "sample": j,
                    "prompt": prompt,
                    "generated_text": comp.text,
                    "ground_truth": row["ground_truth"],
                    "finish_reason": comp.finish_reason,
                    "num_tokens": comp.num_tokens,
                }
            )
            if args.logprobs:  # ids include the EOS when one was sampled; one log-prob per id
                samples[-1].update(token_ids=list(comp.token_ids), logprobs=comp.logprobs)
    return samples


def load_decoded(path: str, expected: int) -> list[dict]:
    samples = list(iter_jsonl(path))
    if len(samples) != expected:
        raise DataFormatError(
            path, f"has {len(samples)} samples, expected {expected} (rows x n); rerun with --force_generate True"
        )
    return samples


def run(args) -> Optional[dict]:
    """Generate (or reuse), grade, write outputs; returns the JSON summary (None with --skip_scoring)."""
    if args.add_oat_evaluate:  # LUFFY's rule: OAT's boxed grader, whole text when </think> is missing
        args.grader = "oat_any" if args.any_true else "oat"
    elif args.any_true:  # LUFFY reads --any_true only under --add_oat_evaluate: alone it changes nothing
        print(
            f"note: --any_true without --add_oat_evaluate has no effect (as in LUFFY); grading with --grader "
            f"{args.grader}. For math-verify OR the rule grader after </think> use --grader both",
            file=sys.stderr,
        )
    if args.max_tokens != LUFFY_MAX_TOKENS:
        raise ValueError(
            f"--max_tokens {args.max_tokens}: LUFFY's generate_vllm.py ignores this flag and always "
            f"generates up to {LUFFY_MAX_TOKENS} tokens; drop it to match LUFFY, or pass "
            f"--max_new_tokens {args.max_tokens}"
        )
    if args.max_new_tokens is not None:
        args.max_tokens = args.max_new_tokens
    rows = select_rows(read_eval_table(args.input_file), args.max_rows, args.max_rows_per_source)
    if not rows:
        raise DataFormatError(args.input_file, "no rows to evaluate")
    if args.force_generate or not os.path.exists(decoded_path(args.output_file)):
        args.model_path = resolve_model_path(args.model_path, args.export_checkpoint)
    if (
        args.remove_system
        and args.system_prompt is None
        and any(m.get("role") == "system" for r in rows for m in r["prompt"][:1])
    ):
        print(
            "note: dropping the input's system turn (--remove_system True, LUFFY's eval); a model trained with "
            "it (e.g. the quickstart's) needs --remove_system False"
        )
    print(
        f"{len(rows)} rows x n={args.n}: temperature {args.temperature}, top_p {args.top_p}, "
        f"max_tokens {args.max_tokens}, template {args.template}, remove_system {args.remove_system}"
    )
    dec_path = decoded_path(args.output_file)
    t0 = time.time()
    if args.force_generate or not os.path.exists(dec_path):
        samples = generate_samples(args, rows)
        _write_jsonl(samples, dec_path)
    else:
        print(f"reusing {dec_path} (--force_generate False)")
        samples = load_decoded(dec_path, len(rows) * args.n)
    gen_seconds = time.time() - t0
    if args.skip_scoring:
        print(f"decoded samples written to {dec_path}; scoring skipped")
        return None
    t1 = time.time()
    grades = grade_samples(
        samples,
        args.grader,
        add_think_before_answer=args.add_think_before_answer,
        no_split_think=args.no_split_think,
        workers=args.grader_workers,
        timeout_s=args.grade_timeout,
        progress_bar=lambda it, total: progress(it, "grading", total, unit="sample"),
    )
    for sample, grade in zip(samples, grades):
        sample.update(correct=grade.correct, grader=args.grader, answer=grade.answer, grade_status=grade.status)
    _write_jsonl(samples, args.output_file)
    summary = summarize(samples)
    for line in report_lines(summary):
        print(line)
    skipped = sum(s["finish_reason"] == "prompt_too_long" for s in samples)
    if skipped:
        print(
            f"skipped {skipped} sample(s) whose prompt does not fit the model context (graded wrong; "
            "--overlong_prompts error stops instead, --max_model_len raises the context)"
        )
    finish = collections.Counter(s["finish_reason"] for s in samples)
    # Limit hits are always listed, 0 included, so a summary without them means none happened.
    statuses = collections.Counter({"timeout": 0, "unparseable": 0})
    statuses.update(s["grade_status"] for s in samples)
    print("grading outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    result = {
        "input_file": args.input_file,
        "model_path": args.model_path,
        "output_file": args.output_file,
        "rows": len(rows),
        "samples": len(samples),
        "grader": args.grader,
        "grading_rule": RULES[args.grader],
        "sampling": {
            "n": args.n,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "max_tokens": args.max_tokens,
            "seed": args.seed,
        },
        "template": args.template,
        "remove_system": args.remove_system,
        "backend": args.backend,
        "finish_reasons": dict(finish),
        "grade_status": dict(statuses),
        "overlong_prompts_skipped": finish.get("prompt_too_long", 0),
        "mean_response_tokens": sum(s["num_tokens"] for s in samples) / len(samples),
        "generation_seconds": round(gen_seconds, 2),
        "grading_seconds": round(time.time() - t1, 2),
        **summary_to_json(summary),
    }
    with open(summary_path(args.output_file), "w") as f:
        json.dump(result, f, indent=1)
    print(f"samples: {args.output_file}; summary: {summary_path(args.output_file)}")
    return result


def main(argv: Optional[Sequence[str]] = None) -> None:
    run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(run_cli(main))
