"""exp_scripts/bench_logprobs.py at a small size: both read-backs give the same rollout_log_probs, and the report
names each phase's seconds and the before / after ratios."""

import pytest

pytest.importorskip("vllm")


def test_the_benchmark_compares_equal_results_and_reports_ratios(capsys):
    from exp_scripts.bench_logprobs import bench_logprobs, main

    result = bench_logprobs(tokens=2_000, rows=8, repeats=1)  # raises if the read-backs differ
    assert result["tokens"] == 2_000 and result["rows"] == 8
    for key in ("ratio_engine_fill", "ratio_read_back", "ratio_total"):
        assert result[key] > 0
    assert main(["--tokens", "400", "--rows", "4", "--repeats", "1"]) == 0
    assert "ratio before/after: read-back" in capsys.readouterr().out
