"""Shared helpers of the data-preparation and evaluation scripts.

Reads jsonl/json/parquet tables as plain Python records, validates LUFFY's training format
(docs/METHOD.md §3.1) and evaluation format (§3.2) with one-line errors that name the file, the row and
the column, builds the R1-style prompt of §3.3, and provides the progress bar, the drop summary and the
writer every prepare script uses. Rows are numbered from 0 in table order (as pandas shows them);
jsonl errors also give the 1-based line number.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import sys
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

# LUFFY's system prompt, identical in every training and validation file (docs/METHOD.md §3.3).
R1_SYSTEM_PROMPT = (
    "Your task is to follow a systematic, thorough reasoning process before providing the final solution. "
    "This involves analyzing, summarizing, exploring, reassessing, and refining your thought process through "
    "multiple iterations. Structure your response into two sections: Thought and Solution. In the Thought "
    'section, present your reasoning using the format: "<think>\n {thoughts} </think>\n". Each thought should '
    "include detailed analysis, brainstorming, verification, and refinement of ideas. After \"</think>\n,\" in "
    "the Solution section, provide the final, logical, and accurate answer, clearly derived from the "
    "exploration in the Thought section. If applicable, include the answer in \\boxed{} for closed-form "
    "results like multiple choices or mathematical solutions."
)
THINK_OPEN = "<think>\n"
THINK_CLOSE = "</think>"

TRAINING_COLUMNS = ("data_source", "prompt", "target", "ability", "reward_model", "extra_info")
TABLE_EXTENSIONS = (".parquet", ".jsonl", ".json")


class DataFormatError(ValueError):
    """Malformed input; ``str(err)`` is one line: ``<file>: row <r>, column '<c>': <problem>``."""

    def __init__(
        self,
        path: str,
        message: str,
        row: Optional[int] = None,
        column: Optional[str] = None,
        line: Optional[int] = None,
    ):
        self.path, self.row, self.column, self.line = path, row, column, line
        where = []
        if line is not None:
            where.append(f"line {line}")
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column '{column}'")
        # Keep the message on one line: it is meant for a terminal and a grep.
        self.problem = " ".join(str(message).split())
        super().__init__(f"{path}: " + "".join(f"{w}: " for w in [", ".join(where)] if w) + self.problem)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------- reading
def _table_kind(path: str) -> str:
    for ext in TABLE_EXTENSIONS:
        if path.endswith(ext):
            return ext
    raise DataFormatError(path, f"unsupported file type; expected one of {', '.join(TABLE_EXTENSIONS)}")


def _to_python(value: Any) -> Any:
    """numpy arrays/scalars (pandas' view of parquet lists) -> plain lists and Python scalars."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _to_python(value.tolist())
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_python(v) for v in value]
    return value


def iter_jsonl(path: str) -> Iterator[dict]:
    """Yield the objects of a jsonl file; blank lines are skipped, a bad line raises DataFormatError."""
    row = 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:  # one line naming file and line, not a traceback
                raise DataFormatError(
                    path,
                    f"not valid UTF-8 (byte {raw[err.start]:#04x} at character {err.start + 1})",
                    row=row,
                    line=line_no,
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFormatError(
                    path, f"invalid JSON at character {err.colno}: {err.msg}", row=row, line=line_no
                ) from None
            if not isinstance(obj, dict):
                raise DataFormatError(path, f"expected a JSON object, got {type(obj).__name__}", row=row, line=line_no)
            yield obj
            row += 1


def read_records(path: str, max_rows: Optional[int] = None) -> list[dict]:
    """Read a .parquet / .jsonl / .json table into a list of plain dicts (at most ``max_rows``)."""
    if not os.path.exists(path):
        raise DataFormatError(path, "file not found")
    kind = _table_kind(path)
    if kind == ".jsonl":
        records = []
        for obj in iter_jsonl(path):
            if max_rows is not None and len(records) >= max_rows:
                break
            records.append(obj)
        return records
    if kind == ".json":
        with open(path, encoding="utf-8") as f:
            try:
                obj = json.load(f)
            except json.JSONDecodeError as err:
                raise DataFormatError(path, f"invalid JSON: {err.msg}", line=err.lineno) from None
            except UnicodeDecodeError as err:
                raise DataFormatError(path, f"not valid UTF-8 (byte offset {err.start})") from None
        if isinstance(obj, dict):  # pandas' default to_json layout: {column: {row_key: value}}
            columns = list(obj)
            keys = list(obj[columns[0]]) if columns and isinstance(obj[columns[0]], dict) else []
            if not all(isinstance(obj[c], dict) for c in columns):
                raise DataFormatError(path, "expected a list of objects or a {column: {row: value}} mapping")
            records = [{c: obj[c].get(k) for c in columns} for k in keys]
        elif isinstance(obj, list):
            for i, item in enumerate(obj):
                if not isinstance(item, dict):
                    raise DataFormatError(path, f"expected a JSON object, got {type(item).__name__}", row=i)
            records = obj
        else:
            raise DataFormatError(path, "expected a list of objects")
        return records[:max_rows] if max_rows is not None else records
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise DataFormatError(path, f"cannot read parquet: {err}") from None
    table = table.drop([c for c in table.column_names if c.startswith("__index_level_")])
    if max_rows is not None:
        table = table.slice(0, max_rows)
    return table.to_pylist()


# ------------------------------------------------------------------------------------------- validation
def require_columns(records: Sequence[Mapping], columns: Iterable[str], path: str) -> None:
    """Every record has every column (a column absent from the whole file is reported at row 0)."""
    columns = list(columns)
    for i, rec in enumerate(records):
        for col in columns:
            if col not in rec:
                present = ", ".join(sorted(rec)) or "none"
                raise DataFormatError(path, f"missing column (columns present: {present})", row=i, column=col)


def check_text(value: Any, path: str, row: int, column: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise DataFormatError(path, f"expected a string, got {type(value).__name__} {_short(value)}", row, column)
    if not allow_empty and not value.strip():
        raise DataFormatError(path, "empty text", row, column)
    return value


def check_chat(value: Any, path: str, row: int, column: str) -> list[dict]:
    """A chat list ``[{role, content}, ...]`` (numpy arrays from pandas are accepted); returns plain dicts."""
    value = _to_python(value)
    if not isinstance(value, list):
        raise DataFormatError(
            path,
            f"expected a list of {{role, content}} messages, got {type(value).__name__} {_short(value)}",
            row,
            column,
        )
    if not value:
        raise DataFormatError(path, "empty message list", row, column)
    messages = []
    for j, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            raise DataFormatError(
                path, f"message {j} is not a {{role: str, content: str}} mapping: {_short(msg)}", row, column
            )
        messages.append({"role": msg["role"], "content": msg["content"]})
    return messages


def check_ground_truth(reward_model: Any, path: str, row: int, column: str = "reward_model") -> str | list[str]:
    """``reward_model.ground_truth`` as a non-empty string (numbers are converted) or a list of them."""
    reward_model = _to_python(reward_model)
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise DataFormatError(path, f"expected a mapping with 'ground_truth', got {_short(reward_model)}", row, column)
    gt = reward_model["ground_truth"]
    col = f"{column}.ground_truth"
    if isinstance(gt, (int, float)) and not isinstance(gt, bool):
        gt = str(gt)
    if isinstance(gt, list):
        if not gt or not all(isinstance(g, str) and g.strip() for g in gt):
            raise DataFormatError(path, f"expected non-empty strings, got {_short(gt)}", row, col)
    else:
        check_text(gt, path, row, col)
    from verl.utils.dataset.value_checks import ground_truth_problem

    problem = ground_truth_problem(gt)  # NaN/inf: the graders would match a response answering nan
    if problem is not None:
        raise DataFormatError(path, f"ground truth {problem}", row, col)
    return gt


def validate_training_row(rec: Mapping, path: str, row: int) -> dict:
    """Check one training row (docs/METHOD.md §3.1) and return it normalised to plain Python values."""
    for col in TRAINING_COLUMNS:
        if col not in rec:
            raise DataFormatError(path, f"missing column (columns present: {', '.join(sorted(rec))})", row, col)
    prompt = check_chat(rec["prompt"], path, row, "prompt")
    if not any(m["role"] == "user" for m in prompt):
        raise DataFormatError(path, "no 'user' message", row, "prompt")
    target = check_chat(rec["target"], path, row, "target")
    check_text(target[0]["content"], path, row, "target")
    extra = _to_python(rec["extra_info"])
    if not isinstance(extra, dict):
        raise DataFormatError(path, f"expected a mapping {{index, split}}, got {_short(extra)}", row, "extra_info")
    out = dict(rec)
    out.update(
        data_source=check_text(rec["data_source"], path, row, "data_source"),
        prompt=prompt,
        target=target,
        ability=check_text(rec["ability"], path, row, "ability"),
        reward_model={
            "ground_truth": check_ground_truth(rec["reward_model"], path, row),
            "style": str(_to_python(rec["reward_model"]).get("style", "rule")),
        },
        extra_info=extra,
    )
    return out


def validate_eval_row(rec: Mapping, path: str, row: int, prompt_key: str = "prompt") -> dict:
    """Check one benchmark row (docs/METHOD.md §3.2); returns ``{data_source, prompt, ground_truth, index, row}``."""
    for col in ("data_source", prompt_key, "reward_model"):
        if col not in rec:
            raise DataFormatError(path, f"missing column (columns present: {', '.join(sorted(rec))})", row, col)
    prompt = check_chat(rec[prompt_key], path, row, prompt_key)
    extra = _to_python(rec.get("extra_info")) or {}
    index = extra.get("index") if isinstance(extra, dict) else None
    return {
        "data_source": check_text(rec["data_source"], path, row, "data_source"),
        "prompt": prompt,
        "ground_truth": check_ground_truth(rec["reward_model"], path, row),
        "index": index,
        "row": row,
    }


def read_eval_table(path: str, max_rows: Optional[int] = None, prompt_key: str = "prompt") -> list[dict]:
    return [validate_eval_row(r, path, i, prompt_key) for i, r in enumerate(read_records(path, max_rows))]


# ------------------------------------------------------------------------------------ prompts and traces
def build_prompt(question: str, system_prompt: Optional[str] = R1_SYSTEM_PROMPT) -> list[dict]:
    """LUFFY's chat prompt: [system (when given), user = the bare problem text]."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return system + [{"role": "user", "content": question}]


def user_text(prompt: Sequence[Mapping]) -> str:
    """The (last) user message of a chat prompt: the problem text."""
    for msg in reversed(prompt):
        if msg["role"] == "user":
            return msg["content"]
    raise ValueError("prompt has no user message")


def has_think_structure(trace: str) -> bool:
    """A trace LUFFY can use: opens with ``<think>\\n`` and closes the block before the solution."""
    return trace.startswith(THINK_OPEN) and THINK_CLOSE in trace[len(THINK_OPEN) :]


def strip_think_open(trace: str) -> str:
    """Drop the leading ``<think>\\n`` (the chat template's generation prompt already opens it)."""
    return trace[len(THINK_OPEN) :] if trace.startswith(THINK_OPEN) else trace


def prompt_hash_fraction(text: str, seed: int = 0) -> float:
    """A stable pseudo-random number in [0, 1) per problem text (sha256 of the seed and the text).

    Splits made with it are reproducible across runs and machines, and duplicates of one problem always
    land on the same side.
    """
    digest = hashlib.sha256(f"{seed}\x00{text.strip()}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


# ------------------------------------------------------------------------------- progress and summaries
def progress(iterable: Iterable, desc: str, total: Optional[int] = None, unit: str = "row"):
    """tqdm bar on stderr; hidden automatically when stderr is not a terminal (logs stay clean)."""
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, disable=None, dynamic_ncols=True)


class DropSummary:
    """Counts rows read/written and, per reason, the rows and traces that were dropped."""

    def __init__(self) -> None:
        self.read = 0
        self.written = 0
        self.rows_dropped: collections.Counter = collections.Counter()
        self.traces_dropped: collections.Counter = collections.Counter()

    def drop_row(self, reason: str) -> None:
        self.rows_dropped[reason] += 1

    def drop_trace(self, reason: str) -> None:
        self.traces_dropped[reason] += 1

    def lines(self) -> list[str]:
        out = [f"rows read: {self.read}, written: {self.written}, dropped: {sum(self.rows_dropped.values())}"]
        out += [f"  row dropped ({reason}): {n}" for reason, n in sorted(self.rows_dropped.items())]
        out += [f"  trace dropped ({reason}): {n}" for reason, n in sorted(self.traces_dropped.items())]
        return out

    def as_dict(self) -> dict:
        return {
            "read": self.read,
            "written": self.written,
            "rows_dropped": dict(self.rows_dropped),
            "traces_dropped": dict(self.traces_dropped),
        }


# ---------------------------------------------------------------------------------------------- writing
def write_records(records: Sequence[Mapping], path: str) -> str:
    """Write records as .parquet (struct/list columns like LUFFY's files), .jsonl or .json."""
    kind = _table_kind(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if kind == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not records:
            raise ValueError(f"{path}: nothing to write (0 rows)")
        pq.write_table(pa.Table.from_pylist([dict(r) for r in records]), path)
    elif kind == ".jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    else:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(list(records), f, ensure_ascii=False)
    return path


def sibling_path(path: str, tag: str) -> str:
    """``out/train.parquet`` + ``val`` -> ``out/train.val.parquet`` (same extension)."""
    kind = _table_kind(path)
    return path[: -len(kind)] + f".{tag}{kind}"


def run_cli(main_fn, argv: Optional[Sequence[str]] = None) -> int:
    """Run a script's main; a DataFormatError (or a ``SystemExit("error: ...")``) becomes its ``error: ...`` line on
    stderr and exit code 2."""
    try:
        main_fn(argv)
    except DataFormatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        if not isinstance(exc.code, str):  # argparse's own exits (2), sys.exit(n)
            raise
        print(exc.code, file=sys.stderr)  # the scripts' `SystemExit("error: ...")`: bad input, exit 2 like the rest
        return 2
    return 0


# ------------------------------------------------------------------------------------------ CLI helpers
def parse_bool(text: str | bool) -> bool:
    """``True/False/1/0/yes/no`` (any case) -> bool, for fire-style ``--flag False`` arguments."""
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("true", "1", "yes", "y", "on"):
        return True
    if value in ("false", "0", "no", "n", "off"):
        return False
    import argparse

    raise argparse.ArgumentTypeError(f"expected a boolean (True/False), got {text!r}")


def add_bool_arg(parser, *names: str, default: bool, help: str) -> None:
    """A boolean option accepting ``--flag``, ``--flag True``, ``--flag=false`` (fire's forms)."""
    parser.add_argument(
        *names,
        type=parse_bool,
        nargs="?",
        const=True,
        default=default,
        metavar="BOOL",
        help=f"{help} (default: {default})",
    )
