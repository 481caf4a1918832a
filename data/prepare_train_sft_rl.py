"""Held-out data for SFT-then-RL: split one training table into an SFT part and an RL part.

LUFFY's SFT+RL baseline fine-tunes on one set of problems and runs RL on prompts disjoint from it
(``Elliott/Openr1-Math-48k-Complement``, docs/METHOD.md §2.3 / §3.1). Here a seeded hash of each problem's
text sends it to the SFT side (probability ``--sft_fraction``) or the RL side, so the two parts never
share a problem, duplicates stay together and the split is the same on every machine.
``--exclude`` drops problems that appear in other tables (e.g. the main RL training set) from both parts.
Outputs: ``--rl_output`` in the training format (docs/METHOD.md §3.1) and ``--sft_output`` in the SFT format of
``prepare_sft.py`` (jsonl or parquet); ``--sft_train_format`` writes the SFT part in the training format instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:  # run as a file, or from another directory: `data`/`eval_scripts` live here
    sys.path.insert(0, _REPO_ROOT)

from verl.utils.data_format import (
    DataFormatError,
    DropSummary,
    prompt_hash_fraction,
    read_records,
    run_cli,
    user_text,
    validate_training_row,
    write_records,
)
from data.prepare_sft import to_sft_record


def problem_texts(path: str) -> set[str]:
    """Problem texts (user message, stripped) of a table in the training format."""
    return {user_text(validate_training_row(r, path, i)["prompt"]).strip() for i, r in enumerate(read_records(path))}


def split_sft_rl(
    rows: Sequence[dict], sft_fraction: float, seed: int, excluded: frozenset = frozenset()
) -> tuple[list[dict], list[dict], int]:
    """(sft rows, rl rows, number excluded) for validated training rows; problem-disjoint by construction."""
    if not 0.0 < sft_fraction < 1.0:
        raise ValueError(f"sft_fraction must be in (0, 1), got {sft_fraction}")
    sft, rl, n_excluded = [], [], 0
    for row in rows:
        text = user_text(row["prompt"]).strip()
        if text in excluded:
            n_excluded += 1
        elif prompt_hash_fraction(text, seed) < sft_fraction:
            sft.append(row)
        else:
            rl.append(row)
    return sft, rl, n_excluded


def _reindex(rows: list[dict], split: str) -> list[dict]:
    return [{**r, "extra_info": {"index": i, "split": split}} for i, r in enumerate(rows)]


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python data/prepare_train_sft_rl.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--input", required=True, help="training table in LUFFY's format (e.g. from prepare_train.py)")
    ap.add_argument("--sft_output", required=True, help="SFT part (.jsonl/.parquet)")
    ap.add_argument("--rl_output", required=True, help="RL part, training format (.parquet)")
    ap.add_argument("--sft_fraction", type=float, default=0.5, help="share of problems for SFT")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split hash")
    ap.add_argument("--exclude", nargs="*", default=[], help="tables whose problems must appear in neither part")
    ap.add_argument("--max_rows", type=int, default=None, help="only the first N input rows")
    ap.add_argument(
        "--sft_train_format",
        action="store_true",
        help="write the SFT part in the training format (prompt/target chat lists) instead",
    )
    args = ap.parse_args(argv)
    if not 0.0 < args.sft_fraction < 1.0:
        raise SystemExit(f"error: --sft_fraction must be in (0, 1), got {args.sft_fraction}")
    rows = [validate_training_row(r, args.input, i) for i, r in enumerate(read_records(args.input, args.max_rows))]
    if not rows:
        raise DataFormatError(args.input, "no rows")
    excluded = frozenset().union(*(problem_texts(p) for p in args.exclude)) if args.exclude else frozenset()
    sft, rl, n_excluded = split_sft_rl(rows, args.sft_fraction, args.seed, excluded)
    summary = DropSummary()
    summary.read, summary.written = len(rows), len(sft) + len(rl)
    if n_excluded:
        summary.rows_dropped["problem in an --exclude table"] = n_excluded
    if not sft or not rl:
        raise SystemExit(f"error: split left an empty part (sft {len(sft)}, rl {len(rl)}); adjust --sft_fraction")
    write_records(_reindex(rl, "train"), args.rl_output)
    sft_records = _reindex(sft, "train") if args.sft_train_format else [to_sft_record(r) for r in sft]
    write_records(sft_records, args.sft_output)
    for line in summary.lines():
        print(line)
    print(f"sft: {args.sft_output} ({len(sft)} rows), rl: {args.rl_output} ({len(rl)} rows)")
    return {"sft": len(sft), "rl": len(rl), "excluded": n_excluded}


if __name__ == "__main__":
    sys.exit(run_cli(main))
