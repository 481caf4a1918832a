"""exp_scripts/quickstart_summary.py: the summary quickstart.sh prints after training (from metrics.jsonl)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "exp_scripts", "quickstart_summary.py")


def _write_metrics(run_dir, steps=30):
    with open(run_dir / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "val/avg_score": 0.25}) + "\n")
        for s in range(1, steps + 1):
            rec = {"step": s, "on_off_metrics/on_score": 0.0 if s <= 10 else (0.5 if s > 20 else 0.2),
                   "actor/entropy_loss": 1.0}
            if s % 15 == 0:
                rec["val/avg_score"] = 0.25 + s / 100
            f.write(json.dumps(rec) + "\n")


def test_summary_reports_steps_reward_first_vs_last_validation_and_paths(tmp_path):
    _write_metrics(tmp_path)
    (tmp_path / "best" / "actor").mkdir(parents=True)
    proc = subprocess.run([sys.executable, SCRIPT, "--run-dir", str(tmp_path), "--wall-s", "42"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "steps: 30; time: 42 s wall" in out
    assert "first 10 steps 0.000 -> last 10 steps 0.500" in out
    assert "0.250 (step 0) -> 0.550 (step 30)" in out
    assert f"metrics: {tmp_path}/metrics.jsonl" in out and f"best checkpoint: {tmp_path}/best/actor" in out
    assert f"plots: {tmp_path}/plots" in out and (tmp_path / "plots" / "reward.png").exists()


def test_summary_without_metrics_says_why(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, "--run-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 1 and "no " in proc.stdout and "metrics.jsonl" in proc.stdout
