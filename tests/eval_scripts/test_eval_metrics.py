"""eval_scripts/metrics.py: unbiased pass@k, avg@k over replicated rows, LUFFY's summary lines."""

from __future__ import annotations

import pytest

from eval_scripts.metrics import (
    ks_up_to,
    macro_average,
    micro_accuracy,
    pass_at_k,
    report_lines,
    summarize,
    summary_to_json,
)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 1, 2, 0.4),  # 1 - C(4,2)/C(5,2) = 1 - 6/10
        (5, 1, 3, 0.6),  # 1 - C(4,3)/C(5,3) = 1 - 4/10
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (4, 0, 4, 0.0),
        (4, 2, 3, 1.0),  # n - c < k
    ],
)
def test_pass_at_k_matches_the_combinatorial_formula(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_impossible_arguments():
    for n, c, k in [(4, 1, 5), (4, 5, 1), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_ks_are_powers_of_two_plus_the_sample_count():
    assert ks_up_to(1) == [1] and ks_up_to(4) == [1, 2, 4] and ks_up_to(6) == [1, 2, 4, 6]
    assert ks_up_to(32) == [1, 2, 4, 8, 16, 32]


def _records():
    recs = []
    # aime: problem 0 replicated 4x with 1 correct, problem 1 with 4/4 (rows share extra_info.index)
    recs += [{"data_source": "aime", "index": 0, "correct": c} for c in (True, False, False, False)]
    recs += [{"data_source": "aime", "index": 1, "correct": True} for _ in range(4)]
    # math: 3 problems, 1 sample each, 1 correct
    recs += [{"data_source": "math", "index": i, "correct": c} for i, c in enumerate((True, False, False))]
    # amc: uneven sample counts (3 with 2 correct, 5 with 1 correct); no index -> keyed by prompt
    recs += [{"data_source": "amc", "index": None, "prompt": "A", "correct": c} for c in (True, True, False)]
    recs += [
        {"data_source": "amc", "index": None, "prompt": "B", "correct": c} for c in (False, False, True, False, False)
    ]
    return recs


def test_summary_numbers_match_hand_computation():
    s = summarize(_records())
    assert list(s) == ["aime", "math", "amc"]
    aime, math_, amc = s["aime"], s["math"], s["amc"]
    assert (aime["num_samples"], aime["num_problems"], aime["samples_per_problem"]) == (8, 2, [4, 4])
    assert aime["avg"] == pytest.approx(5 / 8)
    assert aime["pass"] == pytest.approx({1: (0.25 + 1) / 2, 2: (0.5 + 1) / 2, 4: 1.0})
    assert math_["avg"] == pytest.approx(1 / 3) and math_["pass"] == pytest.approx({1: 1 / 3})
    assert amc["samples_per_problem"] == [3, 5]
    assert amc["avg"] == pytest.approx(3 / 8)
    assert amc["pass"] == pytest.approx({1: (2 / 3 + 1 / 5) / 2, 2: (1 + 0.4) / 2, 3: (1 + 0.6) / 2})
    assert micro_accuracy(s) == pytest.approx(9 / 19)
    assert macro_average(s) == pytest.approx((5 / 8 + 1 / 3 + 3 / 8) / 3)


def test_report_has_luffy_lines_and_json_keys():
    s = summarize(_records())
    lines = report_lines(s)
    assert lines[:5] == [
        f"accuracy: {9 / 19}",
        f"aime: {5 / 8}",
        f"math: {1 / 3}",
        f"amc: {3 / 8}",
        f"avg acc: {(5 / 8 + 1 / 3 + 3 / 8) / 3}",
    ]
    j = summary_to_json(s)
    assert j["per_source"]["aime"]["pass@4"] == 1.0 and j["per_source"]["aime"]["avg_label"] == "avg@4"
    assert j["per_source"]["amc"]["avg_label"] == "avg" and "pass@4" not in j["per_source"]["amc"]
