"""Turn a checkpoint's graded samples into an off-policy trace file for the pool (``data.off_policy_files``).

Input: the graded output of ``eval_scripts/generate_vllm.py --logprobs True`` run on the *training* parquet
(one JSON line per sample: ``index`` = the training row's ``extra_info.index``, ``correct`` from its grader
pass, the generated ``token_ids`` with their behaviour ``logprobs``). Every correct sample becomes one row
``{index, trace, token_ids, logprobs}``: ``token_ids`` without the final EOS, ``logprobs`` one per token
plus one for that EOS (only when the sample ended with it), which is the format ``OffPolicyPool`` reads.
Identical traces of one prompt are written once; ``--max_per_prompt`` keeps the first K per prompt.

    python data/prepare_off_policy.py GRADED.jsonl --output traces.parquet [--max_per_prompt 2] [--keep all]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
from typing import Optional, Sequence

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from verl.utils.data_format import DataFormatError, run_cli  # noqa: E402

REQUIRED = ("index", "generated_text", "finish_reason", "token_ids", "logprobs")


def trace_row(sample: dict, path: str, line: int) -> dict:
    """One graded sample -> ``{index, trace, token_ids, logprobs}`` (errors name the file and line)."""
    missing = [k for k in REQUIRED if k not in sample]
    if missing:
        hint = " (rerun eval_scripts/generate_vllm.py with --logprobs True)" if "logprobs" in missing else ""
        raise DataFormatError(path, f"missing {missing}{hint}", line=line)
    if sample["index"] is None:
        raise DataFormatError(
            path, "'index' is null: the input parquet needs extra_info.index (the training rows' prompt id)", line=line
        )
    ids, lps = list(sample["token_ids"]), sample["logprobs"]
    if lps is None or len(lps) != len(ids):
        raise DataFormatError(path, f"{0 if lps is None else len(lps)} log-probs for {len(ids)} token ids", line=line)
    lps = [float(v) for v in lps]
    if any(not math.isfinite(v) or v > 1e-6 for v in lps):
        raise DataFormatError(path, "'logprobs' must be finite log-probabilities (<= 0)", line=line)
    if sample["finish_reason"] == "stop":
        ids = ids[:-1]  # the sampled EOS: the pool appends it again; its log-prob stays as the extra entry
    else:
        lps = lps[: len(ids)]
    if not ids:
        raise DataFormatError(path, "empty trace", line=line)
    return {"index": sample["index"], "trace": sample["generated_text"], "token_ids": ids, "logprobs": lps}


def convert(path: str, output: str, keep: str = "correct", max_per_prompt: Optional[int] = None) -> dict:
    """Write the trace parquet; returns counts (samples read, kept, written, prompts)."""
    import pandas as pd

    rows, seen = [], collections.defaultdict(set)
    stats = collections.Counter()
    if not os.path.exists(path):
        raise DataFormatError(path, "file not found")
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:  # bad bytes or JSON: one line naming file and line (exit 2), as docs/reliability.md says
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                sample = json.loads(line)
            except UnicodeDecodeError as err:
                raise DataFormatError(path, f"not valid UTF-8 (byte {raw[err.start]:#04x})", line=line_no) from None
            except json.JSONDecodeError as err:
                raise DataFormatError(path, f"invalid JSON at character {err.colno}: {err.msg}", line=line_no) from None
            if not isinstance(sample, dict):
                raise DataFormatError(path, f"expected a JSON object, got {type(sample).__name__}", line=line_no)
            stats["read"] += 1
            if keep == "correct":
                if "correct" not in sample:
                    raise DataFormatError(
                        path,
                        "no 'correct' field: pass the graded output of generate_vllm.py (not the .decoded.jsonl)",
                        line=line_no,
                    )
                if not sample["correct"]:
                    continue
            stats["kept"] += 1
            row = trace_row(sample, path, line_no)
            key = json.dumps(row["index"])
            if tuple(row["token_ids"]) in seen[key]:
                stats["duplicates"] += 1
                continue
            if max_per_prompt is not None and len(seen[key]) >= max_per_prompt:
                stats["over_max_per_prompt"] += 1
                continue
            seen[key].add(tuple(row["token_ids"]))
            rows.append(row)
    if not rows:
        raise DataFormatError(path, f"no {'correct ' if keep == 'correct' else ''}samples to write")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    pd.DataFrame(rows).to_parquet(output, index=False)
    return {**stats, "written": len(rows), "prompts": len(seen)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python data/prepare_off_policy.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("graded", help="graded samples of generate_vllm.py --logprobs True (.jsonl)")
    ap.add_argument("--output", required=True, help="trace file for data.off_policy_files (.parquet)")
    ap.add_argument(
        "--keep",
        choices=("correct", "all"),
        default="correct",
        help="correct: only samples its grader pass marked correct (the pool's traces are meant to succeed)",
    )
    ap.add_argument("--max_per_prompt", type=int, default=None, help="keep at most K distinct traces per prompt")
    args = ap.parse_args(argv)
    if args.max_per_prompt is not None and args.max_per_prompt < 1:
        ap.error("--max_per_prompt must be >= 1")
    stats = convert(args.graded, args.output, args.keep, args.max_per_prompt)
    print(
        f"{stats['read']} samples, {stats['kept']} {args.keep}, {stats['written']} traces for {stats['prompts']} "
        f"prompts written to {args.output} (duplicates {stats.get('duplicates', 0)}, over --max_per_prompt "
        f"{stats.get('over_max_per_prompt', 0)})"
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
