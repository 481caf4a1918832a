"""Add UFT's hint column to a training table: each row's solution (``target``, LUFFY's one assistant message)
cut into line segments (``luffy_pool.methods.uft.add_hints`` with ``split_solution``: lossless, blank lines stay
with the line before), written as a list of strings under ``--hint_key`` (``algorithm.uft.hint_key``, default ``hint``).
``algorithm.method=uft`` draws each step's hint as the first segments of that list. Every other column is kept.
A row without a solution gets an empty list (no hint). A leading ``<think>\n`` stays in the first segment; the
trainer drops it after a prompt whose template already opens the think block, as it does for the demonstration.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:  # run as a file, or from another directory
    sys.path.insert(0, _REPO_ROOT)

from luffy_pool.methods.uft import add_hints  # noqa: E402
from verl.utils.data_format import DataFormatError, read_records, run_cli, write_records  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python data/prepare_uft_hints.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--input", required=True, help="training table (.parquet/.jsonl/.json)")
    ap.add_argument("--output", required=True, help="the same table with the hint column (.parquet/.jsonl/.json)")
    ap.add_argument("--target_key", default="target", help="column of the full solution (data.target_key)")
    ap.add_argument("--hint_key", default="hint", help="column to write (algorithm.uft.hint_key)")
    args = ap.parse_args(argv)
    records = add_hints(read_records(args.input), args.input, args.target_key, args.hint_key)
    if not records:
        raise DataFormatError(args.input, "no rows")
    write_records(records, args.output)
    print(f"wrote {len(records)} rows with column {args.hint_key!r} to {args.output}")


if __name__ == "__main__":
    sys.exit(run_cli(main))
