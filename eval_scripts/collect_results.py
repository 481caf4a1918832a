"""Gather the graded outputs of one or more checkpoints into LUFFY's benchmark table and a bar chart.

``python eval_scripts/collect_results.py OUT1.jsonl [OUT2.jsonl | DIR ...] [--out_dir DIR]`` reads the
per-sample jsonl files written by ``generate_vllm.py`` (a directory contributes every ``*.jsonl`` in it
except ``*.decoded.jsonl``), recomputes the metrics per data source and writes
``benchmark_results.md``, ``.csv`` and ``.png``. Columns follow the paper: AIME24, AIME25, AMC,
MATH-500, Minerva, Olympiad, Avg, then ARC-c, GPQA, MMLU-Pro, OOD Avg; a data source the table does not
know gets its own column after those, so no benchmark is ever dropped (LUFFY's script lost one). Below the
table, each row names the grading rule of its file (LUFFY's OAT rule or a stricter one).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import sys
from typing import Optional, Sequence

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:  # run as a file, or from another directory: `data`/`eval_scripts` live here
    sys.path.insert(0, _REPO_ROOT)

from verl.utils.data_format import DataFormatError, run_cli
from eval_scripts.metrics import summarize

# (column, data_source names that map to it); the first name is the one in LUFFY's parquets.
IN_DISTRIBUTION = [
    ("AIME24", ("aime", "aime24", "aime_2024")),
    ("AIME25", ("aime25", "aime_2025")),
    ("AMC", ("amc", "amc23")),
    ("MATH-500", ("math", "math500", "math-500", "math_500")),
    ("Minerva", ("minerva", "minerva_math")),
    ("Olympiad", ("olympiad_bench", "olympiadbench", "olympiad")),
]
OUT_OF_DISTRIBUTION = [
    ("ARC-c", ("arc_c", "arc-c", "arc_challenge")),
    ("GPQA", ("gpqa", "gpqa_diamond")),
    ("MMLU-Pro", ("mmlu_pro", "mmlu-pro")),
]
KNOWN = {name: col for col, names in IN_DISTRIBUTION + OUT_OF_DISTRIBUTION for name in names}


def column_for(data_source: str) -> str:
    return KNOWN.get(data_source.lower(), data_source)


def find_outputs(paths: Sequence[str]) -> list[str]:
    """Expand directories to their graded jsonl files (sorted); files are taken as given."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(p for p in glob.glob(os.path.join(path, "*.jsonl")) if not p.endswith(".decoded.jsonl"))
            if not found:
                raise DataFormatError(path, "directory has no graded *.jsonl output of generate_vllm.py")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise DataFormatError(path, "file not found")
    return files


_TRUE, _FALSE = ("true", "True"), ("false", "False")
MAX_REPORTED_ROWS = 10


def parse_correct(value) -> bool:
    """A graded sample's ``correct``: JSON true/false, 0/1, or the strings "true"/"false"; nothing else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip() in _TRUE + _FALSE:
        return value.strip() in _TRUE
    raise ValueError(f"expected true/false, got {value!r:.40}")


def read_graded(path: str) -> list[dict]:
    """The graded samples of one jsonl output; every malformed line is reported (by line), then raised."""
    records, problems = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append(f"line {line_no}: invalid JSON ({err.msg})")
                continue
            if not isinstance(rec, dict):
                problems.append(f"line {line_no}: expected a JSON object, got {type(rec).__name__}")
                continue
            missing = [c for c in ("data_source", "correct") if c not in rec]
            if missing:
                problems.append(
                    f"line {line_no}: missing column {missing[0]!r} (is this a graded generate_vllm.py output?)"
                )
                continue
            if not isinstance(rec["data_source"], str) or not rec["data_source"]:
                problems.append(
                    f"line {line_no}: column 'data_source': expected a name, got {rec['data_source']!r:.40}"
                )
                continue
            try:
                rec["correct"] = parse_correct(rec["correct"])
            except ValueError as exc:
                problems.append(f"line {line_no}: column 'correct': {exc}")
                continue
            records.append(rec)
    if problems:
        more = f"; ... ({len(problems) - MAX_REPORTED_ROWS} more)" if len(problems) > MAX_REPORTED_ROWS else ""
        raise DataFormatError(
            path, f"{len(problems)} malformed row(s): " + "; ".join(problems[:MAX_REPORTED_ROWS]) + more
        )
    return records


def load_scores(path: str, metric: str) -> dict[str, Optional[float]]:
    """Per table column: the metric of one output file (``avg`` or ``pass@k``), as a fraction."""
    records = read_graded(path)
    if not records:
        raise DataFormatError(path, "no graded samples")
    scores: dict[str, Optional[float]] = {}
    for source, stats in summarize(records).items():
        if metric == "avg":
            value = stats["avg"]
        else:
            value = stats["pass"].get(int(metric.split("@", 1)[1]))  # None: too few samples for that k
        col = column_for(source)
        if col in scores:
            raise DataFormatError(path, f"data sources map to the same column {col!r}", column="data_source")
        scores[col] = value
    return scores


def grading_rule(path: str) -> str:
    """The rule that graded an output file (its samples' ``grader``), described as generate_vllm.py applies it."""
    from eval_scripts.grading import RULES

    names = sorted({str(rec.get("grader", "unknown")) for rec in read_graded(path)})
    return "; ".join(f"{n}: {RULES.get(n, 'not recorded in the file')}" for n in names)


def _mean(values: list[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def build_table(results: dict[str, dict[str, Optional[float]]]) -> tuple[list[str], list[list]]:
    """Header and rows (label, then values as fractions or None); Avg / OOD Avg over the present columns."""
    present = {col for scores in results.values() for col in scores}
    ind = [c for c, _ in IN_DISTRIBUTION if c in present]
    ood = [c for c, _ in OUT_OF_DISTRIBUTION if c in present]
    known = set(ind) | set(ood)
    other = [c for scores in results.values() for c in scores if c not in known]
    other = list(dict.fromkeys(other))  # first appearance order, no duplicates
    header = ["Model"] + ind + (["Avg"] if ind else []) + ood + (["OOD Avg"] if ood else []) + other
    rows = []
    for label, scores in results.items():
        values = [scores.get(c) for c in ind]
        row = [label] + values + ([_mean(values)] if ind else [])
        ood_values = [scores.get(c) for c in ood]
        row += ood_values + ([_mean(ood_values)] if ood else [])
        row += [scores.get(c) for c in other]
        rows.append(row)
    return header, rows


def _cell(value) -> str:
    return "-" if value is None else (f"{100 * value:.1f}" if isinstance(value, float) else str(value))


def to_markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(header: list[str], rows: list[list], path: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        # Percent with two decimals (the markdown rounds to one, like the paper); empty = not evaluated.
        writer.writerows([[row[0]] + ["" if v is None else f"{100 * v:.2f}" for v in row[1:]] for row in rows])


def plot_bars(header: list[str], rows: list[list], path: str, metric: str) -> None:
    """Grouped bar chart: one group per benchmark column, one bar per checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = header[1:]
    width = 0.8 / max(1, len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(columns) + 2), 4.0))
    for i, row in enumerate(rows):
        xs = [j + i * width - 0.4 + width / 2 for j in range(len(columns))]
        ax.bar(xs, [100 * v if v is not None else 0.0 for v in row[1:]], width=width, label=str(row[0]))
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels(columns, rotation=30, ha="right")
    ax.set_ylabel(f"{metric} (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _labels(files: list[str]) -> list[str]:
    stems = [os.path.basename(f)[: -len(".jsonl")] if f.endswith(".jsonl") else os.path.basename(f) for f in files]
    if len(set(stems)) == len(stems):
        return stems
    return [os.path.join(os.path.basename(os.path.dirname(os.path.abspath(f))), s) for f, s in zip(files, stems)]


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python eval_scripts/collect_results.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("outputs", nargs="+", help="graded jsonl outputs of generate_vllm.py, or directories of them")
    ap.add_argument("--out_dir", default=".", help="where benchmark_results.{md,csv,png} go")
    ap.add_argument("--metric", default="avg", help="avg (LUFFY's mean over samples) or pass@K, e.g. pass@1")
    ap.add_argument("--labels", nargs="*", default=None, help="row labels, one per output file")
    args = ap.parse_args(argv)
    if args.metric != "avg" and not (args.metric.startswith("pass@") and args.metric[5:].isdigit()):
        ap.error(f"--metric must be avg or pass@K, got {args.metric!r}")
    files = find_outputs(args.outputs)
    labels = args.labels or _labels(files)
    if len(labels) != len(files):
        ap.error(f"--labels has {len(labels)} names for {len(files)} output files")
    results = {label: load_scores(f, args.metric) for label, f in zip(labels, files)}
    header, rows = build_table(results)
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, "benchmark_results")
    # Which grading rule produced each row: LUFFY's --add_oat_evaluate numbers are not comparable to the stricter rules.
    markdown = (
        to_markdown(header, rows)
        + "\n\nGrading rule per row:\n"
        + "\n".join(f"- {label}: {grading_rule(f)}" for label, f in zip(labels, files))
    )
    with open(base + ".md", "w") as f:
        f.write(markdown + "\n")
    write_csv(header, rows, base + ".csv")
    plot_bars(header, rows, base + ".png", args.metric)
    print(markdown)
    print(f"\n({args.metric}, %) written: {base}.md, {base}.csv, {base}.png")


if __name__ == "__main__":
    sys.exit(run_cli(main))
