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
            rec = {
                "step": s,
                "on_off_metrics/on_score": 0.0 if s <= 10 else (0.5 if s > 20 else 0.2),
                "actor/entropy_loss": 1.0,
            }
            if s % 15 == 0:
                rec["val/avg_score"] = 0.25 + s / 100
            f.write(json.dumps(rec) + "\n")


def test_summary_reports_steps_reward_first_vs_last_validation_and_paths(tmp_path):
    _write_metrics(tmp_path)
    (tmp_path / "best" / "actor").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--run-dir", str(tmp_path), "--wall-s", "42"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "steps: 30; time: 42 s wall" in out
    assert "first 10 steps 0.000 -> last 10 steps 0.500" in out
    assert "0.250 (step 0) -> 0.550 (step 30)" in out
    assert f"metrics: {tmp_path}/metrics.jsonl" in out and f"best checkpoint: {tmp_path}/best/actor" in out
    assert f"plots: {tmp_path}/plots" in out and (tmp_path / "plots" / "reward.png").exists()


def test_summary_without_metrics_says_why(tmp_path):
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 1 and "no " in proc.stdout and "metrics.jsonl" in proc.stdout


# quickstart.sh's own choice of run: a stand-in for the venv's python. As the trainer it writes metrics.jsonl where
# Hydra would put the run (the last trainer.default_local_dir override wins) unless STUB_NO_METRICS is set; as the
# summary it records the --run-dir it was given.
QS_STUB = r'''#!{python}
import json, os, sys
out = os.environ["STUB_OUT"]
args = sys.argv[1:]
if any(a.endswith("quickstart_summary.py") for a in args):
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(args, f)
    sys.exit(0)
run_dir = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("trainer.default_local_dir=")][-1]
if not os.environ.get("STUB_NO_METRICS"):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({{"step": 1}}) + "\n")
'''


def _run_quickstart(tmp_path, *overrides, **env_extra):
    qs = tmp_path / "qs"
    for name in ("model/config.json", "data/train.parquet", "data/test.parquet", "data/warm.parquet"):
        (qs / name).parent.mkdir(parents=True, exist_ok=True)
        (qs / name).write_text("")
    # an earlier run in the default folder: its 60 steps must never be reported as this run's
    (qs / "checkpoints").mkdir()
    _write_metrics(qs / "checkpoints", steps=60)
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(QS_STUB.format(python=sys.executable))
    venv_python.chmod(0o755)
    out = tmp_path / "stub_out"
    out.mkdir()
    env = dict(
        os.environ,
        SKIP_SETUP="1",
        QUICKSTART_DIR=str(qs),
        QUICKSTART_WARM_STEPS="0",
        LUFFY_VENV=str(tmp_path / "venv"),
        STUB_OUT=str(out),
        **env_extra,
    )
    proc = subprocess.run(
        ["bash", "exp_scripts/quickstart.sh", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
    return proc, summary, qs


def test_quickstart_summarises_the_run_in_the_overridden_folder_not_an_earlier_one(tmp_path):
    mine = tmp_path / "mine"
    proc, summary, _ = _run_quickstart(
        tmp_path,
        f"trainer.default_local_dir={tmp_path / 'other'}",
        f"trainer.default_local_dir={mine}",
        "trainer.total_training_steps=2",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary is not None and summary[summary.index("--run-dir") + 1] == str(mine), summary


def test_quickstart_says_so_when_this_run_wrote_no_metrics(tmp_path):
    proc, summary, qs = _run_quickstart(tmp_path, "trainer.total_training_steps=2", STUB_NO_METRICS="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary is None, "the earlier run's metrics in the default folder were summarised as this run's"
    assert f"no summary: this run wrote no metrics file in {qs}/checkpoints" in proc.stdout


def test_quickstart_summarises_its_default_folder_when_not_overridden(tmp_path):
    proc, summary, qs = _run_quickstart(tmp_path, "trainer.total_training_steps=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary[summary.index("--run-dir") + 1] == f"{qs}/checkpoints"
