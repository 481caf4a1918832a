"""Build LUFFY's training parquet (docs/METHOD.md §3.1): prompts, one off-policy trace each, ground truths.

Sources (``--source``):
  openr1     OpenR1-Math style table (.parquet/.jsonl/.json): ``problem``, traces (``generations`` list,
             or one string), ``answer``. LUFFY's filters: traces over ``--max_trace_tokens`` tokens and
             traces whose answer fails the project's grader are dropped; the first surviving trace is the
             row's target, a row with none is dropped. Counts are printed.
  gsm8k      GSM8K jsonl (``question``, ``answer``): the worked solution, with its ``<<...>>``
             calculator notes and ``#### N`` line removed, becomes ``<think>\\n...\\n</think>\\nThe answer
             is \\boxed{N}.``; ``N`` (commas stripped) is the ground truth. data_source is ``gsm8k``, NOT
             ``openai/gsm8k``: the reward selector sends that name to verl's ``####``-format scorer, which
             would grade these boxed traces (and the policy's boxed answers) wrong.
  synthetic  the embedded arithmetic task of ``luffy_pool.tiny`` (no input file).
  luffy      LUFFY's own training parquet (docs/METHOD.md §3.1, e.g. ``Elliott/Openr1-Math-46k-8192``): every row validated and
             kept as it is (order, ``extra_info.index``, extra columns), as LUFFY trains on it;
             ``--verify True`` re-grades the targets and reports what it would drop (``--drop_failed True``
             drops), ``--val_dir`` writes LUFFY's validation parquets next to the output (data/luffy_source.py).
The prompt is [system, user=problem] with LUFFY's R1-style system prompt (``--system_prompt``,
``--no_system_prompt``; the synthetic task defaults to its own short prompt, the luffy source keeps the
file's prompt unless told otherwise). ``--val_fraction`` also writes ``<output>.val.parquet``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from typing import Iterator, Optional, Sequence

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:  # run as a file, or from another directory: `data`/`eval_scripts` live here
    sys.path.insert(0, _REPO_ROOT)

from verl.utils.data_format import (
    R1_SYSTEM_PROMPT,
    DataFormatError,
    DropSummary,
    add_bool_arg,
    build_prompt,
    check_ground_truth,
    check_text,
    has_think_structure,
    progress,
    prompt_hash_fraction,
    read_records,
    require_columns,
    run_cli,
    sibling_path,
    user_text,
    write_records,
)

SOURCES = ("openr1", "gsm8k", "synthetic", "luffy")
DEFAULT_DATA_SOURCE = {"openr1": "openr1", "gsm8k": "gsm8k", "synthetic": "synthetic_arith"}
TRACE_COLUMN_CANDIDATES = ("generations", "traces", "solution")


@dataclasses.dataclass
class Candidate:
    """One input row on its way to the output: a question, its candidate traces and its answer."""

    row: int
    question: str
    traces: list[str]
    ground_truth: str
    data_source: str
    prompt: Optional[list[dict]] = None  # kept from a formatted input (luffy source)
    drop_reason: Optional[str] = None  # set when the row is unusable as data (not malformed): counted, skipped


# ------------------------------------------------------------------------------------------------ GSM8K
_CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")


def gsm8k_trace(solution: str, path: str = "<gsm8k>", row: int = 0) -> tuple[str, str]:
    """(trace, ground truth) from a GSM8K worked solution ending in ``#### N``."""
    lines = solution.strip().split("\n")
    answer_lines = [i for i, ln in enumerate(lines) if ln.strip().startswith("####")]
    if not answer_lines:
        raise DataFormatError(path, "worked solution has no '#### <answer>' line", row, "answer")
    last = answer_lines[-1]
    ground_truth = lines[last].strip()[4:].strip().replace(",", "")
    if not ground_truth:
        raise DataFormatError(path, "empty answer after '####'", row, "answer")
    body = "\n".join(ln.rstrip() for i, ln in enumerate(lines) if i != last)
    body = _CALCULATOR_NOTE.sub("", body).strip()
    return f"<think>\n{body}\n</think>\nThe answer is \\boxed{{{ground_truth}}}.", ground_truth


def gsm8k_candidates(
    path: str, max_rows: Optional[int], data_source: str, question_col: str = "question", solution_col: str = "answer"
) -> Iterator[Candidate]:
    records = read_records(path, max_rows)
    require_columns(records, (question_col, solution_col), path)
    for i, rec in enumerate(records):
        question = check_text(rec[question_col], path, i, question_col)
        trace, gt = gsm8k_trace(check_text(rec[solution_col], path, i, solution_col), path, i)
        yield Candidate(i, question.strip(), [trace], gt, data_source)


# ----------------------------------------------------------------------------------------------- OpenR1
def detect_trace_column(records: Sequence[dict], path: str) -> str:
    for col in TRACE_COLUMN_CANDIDATES:
        if records and col in records[0]:
            return col
    raise DataFormatError(
        path,
        f"no trace column found (tried {', '.join(TRACE_COLUMN_CANDIDATES)}); pass --trace_column",
        row=0,
        column=TRACE_COLUMN_CANDIDATES[0],
    )


def openr1_candidates(
    path: str,
    max_rows: Optional[int],
    data_source: str,
    question_col: str = "problem",
    trace_col: Optional[str] = None,
    answer_col: str = "answer",
) -> Iterator[Candidate]:
    records = read_records(path, max_rows)
    trace_col = trace_col or detect_trace_column(records, path)
    require_columns(records, (question_col, trace_col, answer_col), path)
    for i, rec in enumerate(records):
        question = check_text(rec[question_col], path, i, question_col)
        traces = rec[trace_col]
        if isinstance(traces, str):
            traces = [traces]
        if not isinstance(traces, list) or not all(isinstance(t, str) for t in traces):
            raise DataFormatError(
                path, f"expected a string or a list of strings, got {type(traces).__name__}", i, trace_col
            )
        answer = rec[answer_col]
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            # Source datasets have problems without a final answer (proofs); nothing can verify a trace.
            yield Candidate(i, question.strip(), [], "", data_source, drop_reason="no answer to verify against")
            continue
        gt = check_ground_truth({"ground_truth": answer}, path, i, answer_col)
        if isinstance(gt, list):
            raise DataFormatError(path, "expected one answer string, got a list", i, answer_col)
        yield Candidate(i, question.strip(), traces, gt.strip(), data_source)


# ------------------------------------------------------------------------------------------- synthetic
def synthetic_candidates(n_rows: int, level: int, ops: str, seed: int, data_source: str) -> Iterator[Candidate]:
    from luffy_pool.tiny.arith_task import make_problems, solve_with_trace

    seen = set()
    for p in make_problems(4 * n_rows, level=level, ops=tuple(ops), seed=seed):
        if (p.a, p.b, p.op) in seen:
            continue
        seen.add((p.a, p.b, p.op))
        yield Candidate(len(seen) - 1, p.question, [solve_with_trace(p)], str(p.answer), data_source)
        if len(seen) >= n_rows:
            return


# ------------------------------------------------------------------------------------------- filtering
class TraceFilter:
    """Keeps the first trace of a candidate that has a think block, fits the token limit and grades correct."""

    def __init__(
        self,
        summary: DropSummary,
        tokenizer_path: Optional[str] = None,
        max_trace_tokens: Optional[int] = None,
        grader: Optional[str] = "math_verify",
        workers: int = 1,
    ):
        if max_trace_tokens and not tokenizer_path:
            raise ValueError("--max_trace_tokens needs --tokenizer (a model folder or tokenizer name)")
        self.summary, self.max_trace_tokens, self.grader, self.workers = summary, max_trace_tokens, grader, workers
        self.tokenizer = None
        if max_trace_tokens:
            from verl.utils.tokenizer import hf_tokenizer

            self.tokenizer = hf_tokenizer(tokenizer_path)

    def _too_long(self, traces: list[str]) -> list[bool]:
        if not self.tokenizer:
            return [False] * len(traces)
        ids = self.tokenizer(traces, add_special_tokens=False)["input_ids"]
        return [len(x) > self.max_trace_tokens for x in ids]

    def select(self, candidates: list[Candidate]) -> list[Optional[str]]:
        """The kept trace of each candidate (None: every trace dropped)."""
        chosen: list[Optional[str]] = [None] * len(candidates)
        depth = max((len(c.traces) for c in candidates), default=0)
        # Round r tries the r-th trace of every candidate still without one, so a row's later traces are
        # only graded when its earlier ones failed.
        for r in range(depth):
            todo = [i for i, c in enumerate(candidates) if chosen[i] is None and r < len(c.traces)]
            shaped = []
            for i in todo:
                trace = candidates[i].traces[r]
                if not trace.strip():
                    self.summary.drop_trace("empty")
                elif not has_think_structure(trace):
                    self.summary.drop_trace("no <think>...</think> block")
                else:
                    shaped.append(i)
            long_flags = self._too_long([candidates[i].traces[r] for i in shaped])
            fitting = []
            for i, too_long in zip(shaped, long_flags):
                if too_long:
                    self.summary.drop_trace(f"over {self.max_trace_tokens} tokens")
                else:
                    fitting.append(i)
            for i, failure in zip(fitting, self._verify([candidates[i] for i in fitting], r)):
                if failure is None:
                    chosen[i] = candidates[i].traces[r]
                else:
                    self.summary.drop_trace(failure)
        return chosen

    def _verify(self, cands: list[Candidate], r: int) -> list[Optional[str]]:
        """Per candidate: None when its r-th trace grades correct, else the reason it was dropped."""
        if not self.grader or not cands:
            return [None] * len(cands)
        from eval_scripts.grading import grade_many

        tasks = [(c.traces[r], c.ground_truth, self.grader, True, 10.0) for c in cands]
        bar = lambda it, total: progress(it, f"verifying traces (round {r + 1})", total, unit="trace")  # noqa: E731
        out = []
        for g in grade_many(tasks, self.workers, bar):
            if g.correct:
                out.append(None)
            elif g.status in ("timeout",) or g.status.startswith("error"):
                out.append(f"grader {g.status}")  # not evidence of a wrong answer: reported apart
            else:
                out.append(f"answer fails {self.grader} grading")
        return out


def build_rows(
    candidates: list[Candidate],
    chosen: list[Optional[str]],
    system_prompt: Optional[str],
    keep_prompt: bool,
    summary: DropSummary,
) -> list[dict]:
    rows = []
    for cand, trace in zip(candidates, chosen):
        if cand.drop_reason or trace is None:
            summary.drop_row(cand.drop_reason or "no usable trace")
            continue
        prompt = cand.prompt if keep_prompt and cand.prompt else build_prompt(cand.question, system_prompt)
        rows.append(
            {
                "data_source": cand.data_source,
                "prompt": prompt,
                "target": [{"role": "assistant", "content": trace}],
                "ability": "math",
                "reward_model": {"ground_truth": cand.ground_truth, "style": "rule"},
                "extra_info": {"index": 0, "split": ""},  # set per output file below
            }
        )
    return rows


def split_rows(rows: list[dict], val_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Hash-split by problem text, so duplicates of one problem land on the same side."""
    if val_fraction <= 0:
        return rows, []
    val = [r for r in rows if prompt_hash_fraction(user_text(r["prompt"]), seed) < val_fraction]
    train = [r for r in rows if prompt_hash_fraction(user_text(r["prompt"]), seed) >= val_fraction]
    return train, val


def finalize(rows: list[dict], split: str) -> list[dict]:
    for i, row in enumerate(rows):
        row["extra_info"] = {"index": i, "split": split}
    return rows


# ------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python data/prepare_train.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--source", choices=SOURCES, required=True)
    ap.add_argument("--input", default=None, help="input table (.parquet/.jsonl/.json); not for --source synthetic")
    ap.add_argument("--output", required=True, help="output .parquet (or .jsonl)")
    ap.add_argument("--data_source", default=None, help="data_source value to write (default per source)")
    ap.add_argument("--split", default="train", help="extra_info.split of the main output")
    ap.add_argument("--max_rows", type=int, default=None, help="read only the first N input rows")
    ap.add_argument("--val_fraction", type=float, default=0.0, help="share of problems for <output>.val.*")
    ap.add_argument("--seed", type=int, default=0, help="seed of the val split hash and the synthetic task")
    ap.add_argument("--system_prompt", default=None, help="system prompt text (default: LUFFY's R1-style one)")
    ap.add_argument("--no_system_prompt", action="store_true", help="prompt = [user] only")
    ap.add_argument("--tokenizer", default=None, help="tokenizer for --max_trace_tokens")
    ap.add_argument("--max_trace_tokens", type=int, default=None, help="drop traces longer than this (LUFFY: 8192)")
    ap.add_argument(
        "--grader",
        default="math_verify",
        choices=("math_verify", "rule", "both", "any"),
        help="grader that must accept a trace's answer",
    )
    add_bool_arg(
        ap,
        "--verify",
        default=None,
        help="grade traces and drop the wrong ones (None = True, except for "
        "--source luffy, where True only reports what it would drop)",
    )
    add_bool_arg(ap, "--drop_failed", default=False, help="--source luffy --verify True: also drop the failing rows")
    ap.add_argument(
        "--val_dir",
        default=None,
        help="folder with LUFFY's valid*.parquet (its data/ folder, e.g. "
        "data/benchmarks): each is validated and written next to --output",
    )
    ap.add_argument("--num_workers", type=int, default=1, help="grading processes")
    ap.add_argument("--question_column", default=None, help="default: problem (openr1) / question (gsm8k)")
    ap.add_argument("--trace_column", default=None, help=f"openr1 traces (default: first of {TRACE_COLUMN_CANDIDATES})")
    ap.add_argument("--answer_column", default="answer", help="openr1 answer / gsm8k worked solution column")
    ap.add_argument("--n_rows", type=int, default=512, help="synthetic: number of problems")
    ap.add_argument("--level", type=int, default=2, help="synthetic: difficulty level (operand digits)")
    ap.add_argument("--ops", default="+", help="synthetic: operators, e.g. '+*'")
    return ap


def collect_candidates(args) -> list[Candidate]:
    if args.source != "synthetic" and not args.input:
        raise SystemExit(f"error: --source {args.source} needs --input")
    data_source = args.data_source or DEFAULT_DATA_SOURCE.get(args.source)
    if args.source == "gsm8k":
        it = gsm8k_candidates(
            args.input, args.max_rows, data_source, args.question_column or "question", args.answer_column
        )
    elif args.source == "openr1":
        it = openr1_candidates(
            args.input,
            args.max_rows,
            data_source,
            args.question_column or "problem",
            args.trace_column,
            args.answer_column,
        )
    else:
        it = synthetic_candidates(
            min(args.n_rows, args.max_rows or args.n_rows), args.level, args.ops, args.seed, data_source
        )
    return list(progress(it, f"reading {args.source}"))


def resolve_system_prompt(args) -> tuple[Optional[str], bool]:
    """(system prompt, keep the input's own prompt) from the flags and the source's default."""
    if args.no_system_prompt:
        return None, False
    if args.system_prompt is not None:
        return args.system_prompt, False
    if args.source == "synthetic":
        from luffy_pool.tiny.arith_task import SYSTEM_PROMPT

        return SYSTEM_PROMPT, False
    return R1_SYSTEM_PROMPT, args.source == "luffy"


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    if not 0.0 <= args.val_fraction < 1.0:
        raise SystemExit(f"error: --val_fraction must be in [0, 1), got {args.val_fraction}")
    if args.drop_failed and not (args.source == "luffy" and args.verify):
        raise SystemExit("error: --drop_failed only acts with --source luffy --verify True")
    if args.source == "luffy":
        if not args.input:
            raise SystemExit("error: --source luffy needs --input")
        if args.val_fraction:
            raise SystemExit(
                "error: --val_fraction does not apply to --source luffy (its rows are kept as they are); "
                "use --val_dir for LUFFY's validation parquets"
            )
        from data.luffy_source import prepare_luffy

        return prepare_luffy(args, *resolve_system_prompt(args))
    if args.verify is None:
        args.verify = True
    summary = DropSummary()
    candidates = collect_candidates(args)
    summary.read = len(candidates)
    trace_filter = TraceFilter(
        summary, args.tokenizer, args.max_trace_tokens, args.grader if args.verify else None, args.num_workers
    )
    system_prompt, keep_prompt = resolve_system_prompt(args)
    rows = build_rows(candidates, trace_filter.select(candidates), system_prompt, keep_prompt, summary)
    train, val = split_rows(rows, args.val_fraction, args.seed)
    if not train:
        raise SystemExit("error: no rows left to write\n" + "\n".join(summary.lines()))
    written = {"train": write_records(finalize(train, args.split), args.output)}
    if val:
        written["val"] = write_records(finalize(val, "val"), sibling_path(args.output, "val"))
    summary.written = len(train) + len(val)
    for line in summary.lines():
        print(line)
    names = {"train": args.split}  # the main output is labelled by its --split (e.g. "test:")
    print(
        ", ".join(
            f"{names.get(name, name)}: {path} ({n} rows)"
            for (name, path), n in zip(written.items(), (len(train), len(val)))
        )
    )
    if args.val_dir:
        from data.luffy_source import copy_validation_files

        for path in copy_validation_files(args.val_dir, args.output):
            written[os.path.basename(path)] = path
            print(f"validation file: {path}")
    return {"summary": summary.as_dict(), "paths": written}


if __name__ == "__main__":
    sys.exit(run_cli(main))
