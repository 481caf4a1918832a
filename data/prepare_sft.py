"""Turn a training table (docs/METHOD.md §3.1) into the SFT format of LUFFY's SFT baseline: prompt + target.

Each row becomes ``{"prompt": <chat messages>, "target": <trace>, "data_source": ...}`` where the
trace loses its leading ``<think>\\n`` (the chat template's generation prompt already opens the think
block, so the model is trained to continue from there, as in LUFFY's ``prepare_sft.py``). Output is
jsonl (OpenRLHF ``--input_key prompt --output_key target --apply_chat_template``) or parquet (this
project's SFT trainer, ``data.prompt_key=prompt data.response_key=target``). ``--prompt_format
question`` writes the bare problem text instead of the message list.
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
    progress,
    read_records,
    run_cli,
    strip_think_open,
    user_text,
    validate_training_row,
    write_records,
)

PROMPT_FORMATS = ("messages", "question")


def to_sft_record(
    row: dict, prompt_format: str = "messages", system_prompt: Optional[str] = None, drop_system: bool = False
) -> dict:
    """One validated training row -> ``{prompt, target, data_source}``."""
    prompt = [m for m in row["prompt"] if not (drop_system or system_prompt) or m["role"] != "system"]
    if system_prompt:
        prompt = [{"role": "system", "content": system_prompt}] + prompt
    return {
        "prompt": user_text(prompt) if prompt_format == "question" else prompt,
        "target": strip_think_open(row["target"][0]["content"]),
        "data_source": row["data_source"],
    }


def convert(
    rows: Sequence[dict],
    path: str,
    prompt_format: str = "messages",
    system_prompt: Optional[str] = None,
    drop_system: bool = False,
) -> list[dict]:
    """Validate training rows (docs/METHOD.md §3.1; errors name ``path``/row/column) and convert them; empty traces are errors."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")
    out = []
    for i, rec in enumerate(progress(rows, "converting to SFT", total=len(rows))):
        sft = to_sft_record(validate_training_row(rec, path, i), prompt_format, system_prompt, drop_system)
        if not sft["target"].strip():
            raise DataFormatError(path, "target is empty after removing the leading <think>", i, "target")
        out.append(sft)
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python data/prepare_sft.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--input", required=True, help="training table (.parquet/.jsonl/.json) in LUFFY's format")
    ap.add_argument("--output", required=True, help="SFT output, .jsonl (OpenRLHF) or .parquet")
    ap.add_argument("--max_rows", type=int, default=None, help="only the first N rows")
    ap.add_argument(
        "--prompt_format",
        choices=PROMPT_FORMATS,
        default="messages",
        help="messages = the chat list of the input; question = the bare problem text",
    )
    ap.add_argument("--system_prompt", default=None, help="replace the rows' system message")
    ap.add_argument("--no_system_prompt", action="store_true", help="drop the rows' system message")
    args = ap.parse_args(argv)
    records = convert(
        read_records(args.input, args.max_rows),
        args.input,
        args.prompt_format,
        args.system_prompt,
        args.no_system_prompt,
    )
    if not records:
        raise DataFormatError(args.input, "no rows")
    write_records(records, args.output)
    print(f"wrote {len(records)} SFT rows to {args.output}")


if __name__ == "__main__":
    sys.exit(run_cli(main))
