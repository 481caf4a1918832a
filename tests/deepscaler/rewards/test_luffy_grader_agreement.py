"""This project's graders give LUFFY's own verdicts on the stored agreement set (docs/DESIGN.md §1: graders).

tests/data/luffy_grader_verdicts.jsonl.gz was written by ``exp_scripts/grader_agreement.py --luffy_src``:
LUFFY's code (github ElliottYan/LUFFY, run from a checkout outside the project) graded 6,368 answers: 40
problems of each math benchmark (AIME24 and AIME25 have 30), ARC-c and GPQA, each answered in 12-30 ways.
Graders: reward versions 0-3, the eval's default math-verify label, ``--add_oat_evaluate`` with and
without ``--any_true``. The ``slow`` tests check the rule-based versions on every row, the math-verify
graders on every variant of every sixteenth problem, and every grader on every row; this project's verdicts
are computed once for all three (every row, every grader), split over two processes (grading is one
Python thread; the machine has two cores).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
DATA = os.path.join(ROOT, "tests", "data", "luffy_grader_verdicts.jsonl.gz")
sys.path.insert(0, os.path.join(ROOT, "exp_scripts"))

import luffy_agreement as la  # noqa: E402

RULE_GRADERS = ("v0", "v1", "v2")
MATH_VERIFY_GRADERS = ("v3", "eval_mv", "eval_oat", "eval_oat_any")


@pytest.fixture(scope="module")
def rows():
    return la.read_rows(DATA)


@pytest.fixture(scope="module")
def every_disagreement(rows) -> dict:
    """``la.disagreements(rows)`` for every grader, computed once: rows alternate between two processes."""
    jobs = max(1, min(2, os.cpu_count() or 1))
    # spawn, not fork: the test process may hold Ray / torch threads by now
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = list(pool.map(la.disagreements, [rows[k::jobs] for k in range(jobs)]))
    return {g: [d for part in parts for d in part[g]] for g in la.LUFFY_GRADERS}


def _among(bad: dict, graders, ids=None) -> dict:
    return {g: [d for d in bad[g] if ids is None or d["id"] in ids] for g in graders}


def _report(bad: dict) -> str:
    lines = []
    for grader, items in bad.items():
        for d in items[:5]:
            lines.append(f"{grader} {d['id']}: ours={d['ours']} luffy={d['luffy']} gt={d['gt']!r} ...{d['answer']!r}")
    return "\n".join(lines)


def test_the_set_covers_the_benchmarks_and_answer_forms(rows):
    problems = collections.defaultdict(set)
    ways = collections.defaultdict(set)
    for row in rows:
        bench, index, variant = row["id"].split("/")
        problems[bench].add(index)
        ways[(bench, index)].add(variant)
    assert set(problems) == set(la.MATH_BENCHMARKS) | set(la.CHOICE_FILES)
    for bench, found in problems.items():  # AIME24 / AIME25 have only 30 problems each
        assert len(found) >= (30 if bench in ("aime", "aime25") else 40), bench
    for (bench, _), found in ways.items():
        assert len(found) >= (12 if bench in la.CHOICE_FILES else 15), bench
    variants = {row["variant"] for row in rows}
    for form in (
        "dfrac_swap",
        "degrees",
        "units_text",
        "x_equals",
        "boxed_text",
        "thousands_commas",
        "sci_notation",
        "float_form",
        "rounded_2dp",
        "sqrt_no_braces",
        "reordered",
        "set_braces",
        "no_think_close",
        "double_think_close",
        "unboxed",
        "wrong_by_one",
        "boxed_lower",
        "answer_line",
    ):
        assert form in variants, form
    # LUFFY's graders answered every item (no worker timeout or exception to skip).
    assert all(not isinstance(v, str) for row in rows for v in row["luffy"].values())
    # Both verdicts occur for every grader: the set discriminates.
    for grader in la.LUFFY_GRADERS:
        assert len({row["luffy"][grader] for row in rows}) >= 2, grader


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_rule_versions_agree_with_luffy_on_every_row(every_disagreement):
    bad = _among(every_disagreement, RULE_GRADERS)
    assert not any(bad.values()), _report(bad)


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_math_verify_graders_agree_with_luffy_on_a_stratified_sample(rows, every_disagreement):
    sample = [row for row in rows if int(row["id"].split("/")[1]) % 16 == 0]
    assert len({row["variant"] for row in sample}) >= 35
    bad = _among(every_disagreement, MATH_VERIFY_GRADERS, {row["id"] for row in sample})
    assert not any(bad.values()), _report(bad)


@pytest.mark.slow
def test_every_grader_agrees_with_luffy_on_every_row(rows, every_disagreement):
    assert set(every_disagreement) == set(la.LUFFY_GRADERS) == set(rows[0]["luffy"])
    assert not any(every_disagreement.values()), _report(every_disagreement)
