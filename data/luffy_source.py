"""``prepare_train.py --source luffy``: LUFFY's own training parquet (``Elliott/Openr1-Math-46k-8192``, which
LUFFY's data/prepare_train.py writes unchanged) kept row for row, and LUFFY's validation parquets.

By default every row is validated (docs/METHOD.md §3.1 columns; a malformed row is one error naming file, row and column)
and written as it was: same rows, same order, same ``extra_info.index`` and every extra column (e.g.
``target_ds_qwen_7b_probs``). ``--verify True`` re-grades each target and *reports* the rows the grader
would drop (counts, and one line per row in ``<output>.regrade.jsonl``); only ``--drop_failed True`` drops
them, and the kept rows still keep their indices. ``--val_dir`` validates LUFFY's ``valid*.parquet`` files
(its data/ folder) and writes them next to ``--output``, where exp_scripts/train.sh looks for them.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Optional

from verl.utils.data_format import (
    DataFormatError,
    build_prompt,
    progress,
    read_eval_table,
    read_records,
    sibling_path,
    validate_training_row,
    write_records,
)


def regrade_failures(rows: list[dict], grader: str, workers: int) -> list[dict]:
    """Rows whose target the grader does not accept: ``{row, index, reason}`` each."""
    from eval_scripts.grading import grade_many

    tasks = [(r["target"][0]["content"], r["reward_model"]["ground_truth"], grader, True, 10.0) for r in rows]
    bar = lambda it, total: progress(it, "re-grading targets", total, unit="trace")  # noqa: E731
    failures = []
    for i, (row, g) in enumerate(zip(rows, grade_many(tasks, workers, bar))):
        if not g.correct:
            reason = (
                f"grader {g.status}"
                if g.status == "timeout" or g.status.startswith("error")
                else f"answer fails {grader} grading ({g.status})"
            )
            failures.append({"row": i, "index": row["extra_info"].get("index"), "reason": reason})
    return failures


def copy_validation_files(val_dir: str, output: str) -> list[str]:
    """Validate each ``valid*.parquet`` of ``val_dir`` as a benchmark table and copy it next to ``output``."""
    files = sorted(glob.glob(os.path.join(val_dir, "valid*.parquet")))
    if not files:
        raise DataFormatError(val_dir, "no valid*.parquet here (LUFFY's data/ folder holds valid.parquet, ...)")
    out_dir = os.path.dirname(os.path.abspath(output))
    written = []
    for path in files:
        read_eval_table(path)  # one error naming file, row and column on a malformed row
        target = os.path.join(out_dir, os.path.basename(path))
        if os.path.abspath(path) != target:
            shutil.copyfile(path, target)
        written.append(target)
    return written


def prepare_luffy(args, system_prompt: Optional[str], keep_prompt: bool) -> dict:
    """Keep LUFFY's rows; optional report-only re-grading; optional validation files. Returns the summary."""
    records = read_records(args.input, args.max_rows)
    if not records:
        raise SystemExit(f"error: {args.input}: no rows")
    checked = [validate_training_row(rec, args.input, i) for i, rec in enumerate(progress(records, "checking rows"))]
    out = []
    for rec, row in zip(records, checked):
        rec = dict(rec)
        if args.data_source:
            rec["data_source"] = args.data_source
        if not keep_prompt:  # only when --system_prompt / --no_system_prompt asked for a new prompt
            user = [m["content"] for m in row["prompt"] if m["role"] == "user"][-1]
            rec["prompt"] = build_prompt(user, system_prompt)
        out.append(rec)
    summary = {"read": len(records), "written": len(out), "would_drop": None, "dropped": 0}
    report_path = None
    if args.verify:
        failures = regrade_failures(checked, args.grader, args.num_workers)
        summary["would_drop"] = len(failures)
        report_path = sibling_path(args.output, "regrade").rsplit(".", 1)[0] + ".jsonl"
        with open(report_path, "w") as f:
            for failure in failures:
                f.write(json.dumps(failure) + "\n")
        print(
            f"re-grading with {args.grader}: {len(failures)} of {len(checked)} targets fail; listed in {report_path}"
            + (
                "; dropped (--drop_failed)"
                if args.drop_failed
                else "; kept (LUFFY trained on them; --drop_failed True drops them)"
            )
        )
        if args.drop_failed:
            failed = {f["row"] for f in failures}
            out = [rec for i, rec in enumerate(out) if i not in failed]
            summary["dropped"], summary["written"] = len(failed), len(out)
    if not out:
        raise SystemExit("error: no rows left to write")
    paths = {"train": write_records(out, args.output)}
    if report_path:
        paths["regrade_report"] = report_path
    if args.val_dir:
        for path in copy_validation_files(args.val_dir, args.output):
            paths[os.path.basename(path)] = path
    print(
        f"luffy: {summary['written']} of {summary['read']} rows written to {args.output} (indices kept)"
        + "".join(f"; {name}: {p}" for name, p in paths.items() if name.startswith("valid"))
    )
    return {"summary": summary, "paths": paths}
