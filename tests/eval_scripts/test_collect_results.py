"""eval_scripts/collect_results.py: LUFFY's column order, no dropped benchmark, markdown/CSV/PNG outputs."""

from __future__ import annotations

import json

import pytest

from verl.utils.data_format import DataFormatError
from eval_scripts import collect_results


def _write(path, per_source):
    """per_source: {data_source: [correct flags]} -> a graded jsonl (one problem per sample)."""
    with open(path, "w") as f:
        for source, flags in per_source.items():
            for i, ok in enumerate(flags):
                f.write(json.dumps({"data_source": source, "index": i, "correct": ok}) + "\n")
    return str(path)


def test_columns_follow_luffy_order_and_unknown_sources_are_kept(tmp_path, capsys):
    a = _write(
        tmp_path / "step100.jsonl",
        {
            "olympiad_bench": [1, 0],
            "aime": [1, 1, 0, 0],
            "gpqa": [1],
            "synthetic_arith": [0, 1],
            "math": [1],
            "arc_c": [0, 0],
        },
    )
    b = _write(tmp_path / "step200.jsonl", {"aime": [1, 1, 1, 0], "my_bench": [1]})
    (tmp_path / "step200.decoded.jsonl").write_text("not graded, must be skipped\n")
    collect_results.main([str(tmp_path), "--out_dir", str(tmp_path / "res")])
    md = capsys.readouterr().out
    header = "| Model | AIME24 | MATH-500 | Olympiad | Avg | ARC-c | GPQA | OOD Avg | synthetic_arith | my_bench |"
    assert md.splitlines()[0] == header
    assert md.splitlines()[2] == "| step100 | 50.0 | 100.0 | 50.0 | 66.7 | 0.0 | 100.0 | 50.0 | 50.0 | - |"
    assert md.splitlines()[3] == "| step200 | 75.0 | - | - | 75.0 | - | - | - | - | 100.0 |"
    csv_lines = (tmp_path / "res" / "benchmark_results.csv").read_text().splitlines()
    assert csv_lines[0] == header.strip("| ").replace(" | ", ",")
    assert csv_lines[1] == "step100,50.00,100.00,50.00,66.67,0.00,100.00,50.00,50.00,"
    assert (tmp_path / "res" / "benchmark_results.md").read_text().startswith(header)
    assert (tmp_path / "res" / "benchmark_results.png").read_bytes()[:4] == b"\x89PNG"
    assert a and b


def test_pass_at_k_metric_and_all_six_benchmarks(tmp_path):
    path = tmp_path / "m.jsonl"
    with open(path, "w") as f:
        for source in ["aime", "aime25", "amc", "math", "minerva", "olympiad_bench"]:
            for ok in (True, False):  # one problem, two samples
                f.write(json.dumps({"data_source": source, "index": 0, "correct": ok}) + "\n")
    header, rows = collect_results.build_table({"m": collect_results.load_scores(str(path), "pass@2")})
    assert header == ["Model", "AIME24", "AIME25", "AMC", "MATH-500", "Minerva", "Olympiad", "Avg"]
    assert rows[0][1:] == [1.0] * 7
    _, rows = collect_results.build_table({"m": collect_results.load_scores(str(path), "pass@4")})
    assert rows[0][1:] == [None] * 7  # too few samples for k=4: shown as "-", never invented


def test_a_file_that_is_not_a_graded_output_names_the_missing_column(tmp_path):
    path = tmp_path / "luffy_style.jsonl"
    path.write_text(json.dumps({"prompt": "p", "generated_text": "g", "correctness": True}) + "\n")
    with pytest.raises(DataFormatError, match=r"1 malformed row\(s\): line 1: missing column 'data_source'"):
        collect_results.load_scores(str(path), "avg")


def test_same_file_names_in_different_folders_get_distinct_labels(tmp_path):
    for d in ("run_a", "run_b"):
        (tmp_path / d).mkdir()
        _write(tmp_path / d / "eval.jsonl", {"aime": [1]})
    files = collect_results.find_outputs([str(tmp_path / "run_a"), str(tmp_path / "run_b" / "eval.jsonl")])
    assert collect_results._labels(files) == ["run_a/eval", "run_b/eval"]


# ---------------------------------------------------------------------- strict rows
def test_correct_is_parsed_strictly_so_false_strings_are_not_counted(tmp_path):
    path = tmp_path / "strings.jsonl"
    flags = ["false", "False", False, 0, "true", True, 1, "True"]
    path.write_text(
        "".join(json.dumps({"data_source": "aime", "index": i, "correct": v}) + "\n" for i, v in enumerate(flags))
    )
    assert collect_results.load_scores(str(path), "avg") == {"AIME24": 0.5}


def test_malformed_rows_are_all_reported_by_line(tmp_path):
    rows = [
        {"data_source": "aime", "index": 0, "correct": True},
        {"data_source": None, "index": 1, "correct": True},
        {"data_source": "aime", "index": 2, "correct": "maybe"},
        {"data_source": "aime", "index": 3, "correct": None},
        {"data_source": "aime", "index": 4, "correct": 0.5},
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{torn\n")
    with pytest.raises(DataFormatError) as err:
        collect_results.load_scores(str(path), "avg")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"{path}: 5 malformed row(s): line 2: column 'data_source': expected a name"
    )
    for fragment in (
        "line 3: column 'correct': expected true/false, got 'maybe'",
        "line 4: column 'correct'",
        "line 5: column 'correct': expected true/false, got 0.5",
        "line 6: invalid JSON",
    ):
        assert fragment in msg


def test_the_table_names_the_grading_rule_of_each_row(tmp_path, capsys):
    for name, grader in (("luffy_oat", "oat"), ("strict", "both")):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.write(json.dumps({"data_source": "aime", "index": 0, "correct": True, "grader": grader}) + "\n")
    collect_results.main([str(tmp_path), "--out_dir", str(tmp_path / "res")])
    lines = capsys.readouterr().out.splitlines()
    rules = lines[lines.index("Grading rule per row:") + 1 :][:2]
    assert rules[0].startswith("- luffy_oat: oat: LUFFY --add_oat_evaluate: OAT boxed grader")
    assert rules[1].startswith("- strict: both: math-verify OR rule grader") and "stricter than LUFFY's OAT" in rules[1]
    assert "Grading rule per row:" in (tmp_path / "res" / "benchmark_results.md").read_text()
