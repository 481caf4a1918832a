"""exp_scripts/probe_bad_input.py: its case list loads and a cheap case runs (the full probe is run by hand)."""

from __future__ import annotations

from exp_scripts.probe_bad_input import Context, Outcome, expect_refusal, run_case, select
from exp_scripts.probe_bad_input_cases import CASES


def test_case_list_has_60_or_more_unique_cases_covering_the_review():
    ids = [c.cid for c in CASES]
    assert len(ids) >= 60 and len(set(ids)) == len(ids)
    refs = {c.ref for c in CASES}
    assert {"G3", "G4", "G5", "G6", "G7", "G8", "G9", "G10", "G11", "G12", "G13", "G14", "G15", "Weak", "User"} <= refs
    assert all(c.timeout_s > 0 and c.title for c in CASES)


def test_cheap_cases_run_and_are_judged(tmp_path):
    ctx = Context(str(tmp_path))
    for case in select(CASES, ["oat_nan_vs_nan", "api_key_in_url"]):
        outcome, seconds = run_case(case, ctx)
        assert outcome.verdict in ("good", "weak", "bad") and outcome.seen and seconds < case.timeout_s


def test_judging_rules():
    assert expect_refusal(lambda: None).verdict == "bad"

    def generic():
        raise TypeError("float() argument must be a string or a real number, not 'NoneType'")

    def named():
        raise ValueError("train.parquet: row 3: column 'x': bad")

    assert expect_refusal(generic, "train.parquet").verdict == "weak"
    assert expect_refusal(named, "train.parquet", "row 3").verdict == "good"
    assert expect_refusal(named, "other.parquet").verdict == "weak"
    assert Outcome("good", "x").verdict == "good"
