"""exp_scripts/bench_exgrpo_pool.py on a small run: it fills the pool through the pool's own rules, measures the
previous format (Python lists, version-1 data.pt) against the current one and checks the version-1 state loads."""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "exp_scripts"))

from bench_exgrpo_pool import main  # noqa: E402

GiB = 2**30


def _rows(out):
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(before|after)(.*?)\s+([\d,]+\.\d)\s+([\d,]+\.\d)$", line)  # MiB
        if m:
            rows[(m.group(1) + m.group(2)).strip()] = (
                float(m.group(3).replace(",", "")),
                float(m.group(4).replace(",", "")),
            )
    return rows


def test_small_run_measures_before_and_after(capsys, tmp_path):
    args = [
        "--steps",
        "12",
        "--dataset",
        "300",
        "--batch",
        "16",
        "--n",
        "8",
        "--mean-tokens",
        "400",
        "--max-tokens",
        "1024",
        "--cap",
        "2",
        "--legacy-gib",
        "0.001",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    free = re.search(
        r"unbounded pool after 12 steps .*: ([\d,]+) questions, ([\d,]+) trajectories, ([\d,]+) tokens", out
    )
    capped = re.search(r"max_trajectories_per_question=2 .*: ([\d,]+) questions, ([\d,]+) trajectories", out)
    questions, trajectories, tokens = (int(g.replace(",", "")) for g in free.groups())
    assert questions > 0 and trajectories > questions and tokens > 100 * trajectories  # lengths of ~400 tokens
    assert int(capped.group(2).replace(",", "")) <= 2 * int(capped.group(1).replace(",", ""))
    rows = _rows(out)
    (before_name,) = [k for k in rows if k.startswith("before")]
    per_token = float(re.search(r"lists \((\d+) B/token\)", before_name).group(1))
    assert 60 <= per_token <= 80  # an 8-byte pointer + a 28-byte int, and the same + a 24-byte float, per position
    before, after = rows[before_name], rows["after: int32/float32 arrays, flat tensors, no cap"]
    assert before[0] > 7 * after[0]  # RAM: ~70 B against 8 B (+ headers) per token
    assert 1.9 * after[1] < before[1] < 2.2 * after[1]  # data.pt: 16 B against 8 B per token
    assert "(v1 file of" in out  # --legacy-gib 0.001: a share of the questions was saved and loaded back, scaled
    assert sorted(os.listdir(tmp_path)) == ["data_v2_cap.pt", "data_v2_nocap.pt"]
    assert re.search(r"^checkpoint before/after=\d+\.\d ram before/after=\d+\.\d$", out.strip().splitlines()[-1])
