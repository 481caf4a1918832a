"""exp_scripts/bench_async.py: its default inputs are the quickstart's SFT-warmed model (built when missing), and a
run whose on-policy reward never leaves 0 fails instead of printing curves that measure nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def bench_async():
    spec = importlib.util.spec_from_file_location(
        "bench_async_under_test", os.path.join(REPO, "exp_scripts", "bench_async.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(values):
    return [{"step": i + 1, "timing_s/step": 1.0, "batch/on_solved": v} for i, v in enumerate(values)]


def test_default_model_is_the_warm_one_and_is_built_by_the_quickstart_when_missing(bench_async, tmp_path, monkeypatch):
    qs = tmp_path / "quickstart"
    monkeypatch.setattr(bench_async, "QUICKSTART_DIR", str(qs))
    monkeypatch.setattr(bench_async, "WARM_MODEL", str(qs / "warm_sft_250" / "final"))
    calls = []

    def fake_quickstart(cmd, cwd, env, check):  # what quickstart.sh's prepare-only run leaves behind
        calls.append((cmd, env["QUICKSTART_PREPARE_ONLY"], env["QUICKSTART_DIR"]))
        for name in ("warm_sft_250/final/config.json", "data/train.parquet"):
            (qs / name).parent.mkdir(parents=True, exist_ok=True)
            (qs / name).write_text("{}")

    monkeypatch.setattr(bench_async.subprocess, "run", fake_quickstart)
    args = bench_async.argparse.Namespace(model=None, data=None, work=str(tmp_path / "work"))
    assert bench_async.inputs(args) == (str(qs / "warm_sft_250" / "final"), str(qs / "data"))
    assert len(calls) == 1 and calls[0][0][-1].endswith("exp_scripts/quickstart.sh") and calls[0][1:] == ("1", str(qs))
    assert bench_async.inputs(args)[0].endswith("warm_sft_250/final") and len(calls) == 1  # built once


def test_a_given_model_that_is_missing_is_refused_naming_it(bench_async, tmp_path):
    args = bench_async.argparse.Namespace(model=str(tmp_path / "nope"), data=str(tmp_path), work=str(tmp_path))
    with pytest.raises(SystemExit, match="no model in .*nope"):
        bench_async.inputs(args)


def test_reward_that_never_leaves_zero_fails_the_run(bench_async, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_async, "inputs", lambda args: ("m", "d"))
    curves = {"colocated": [0.0] * 4, "split_sync": [0.0] * 4, "one_step_off": [0.0] * 4}
    monkeypatch.setattr(bench_async, "run_mode", lambda mode, seed, args, model, data: _rows(curves[mode]))
    assert bench_async.main(["--steps", "2", "--warmup", "2", "--seeds", "1", "--work", str(tmp_path)]) == 1
    assert "solves nothing" in capsys.readouterr().err
    curves["one_step_off"] = [0.0, 0.0, 0.25, 0.0]
    assert bench_async.main(["--steps", "2", "--warmup", "2", "--seeds", "1", "--work", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["results"]["one_step_off"]["curves"] == [
        curves["one_step_off"]
    ]


def test_quickstart_prepare_only_builds_the_inputs_and_trains_nothing(tmp_path):
    qs = tmp_path / "qs"
    for name in ("model/config.json", "data/train.parquet", "data/test.parquet", "data/warm.parquet"):
        (qs / name).parent.mkdir(parents=True, exist_ok=True)
        (qs / name).write_text("")
    # the venv's python: records each call; as the SFT trainer it writes the warm model's config
    log = tmp_path / "calls.jsonl"
    stub = tmp_path / "venv" / "bin" / "python"
    stub.parent.mkdir(parents=True)
    stub.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "d = [a.split('=', 1)[1] for a in sys.argv if a.startswith('trainer.default_local_dir=')]\n"
        "os.makedirs(d[0] + '/final', exist_ok=True); open(d[0] + '/final/config.json', 'w').write('{}')\n"
    )
    stub.chmod(0o755)
    env = dict(
        os.environ,
        SKIP_SETUP="1",
        QUICKSTART_DIR=str(qs),
        QUICKSTART_WARM_STEPS="3",
        LUFFY_VENV=str(tmp_path / "venv"),
        QUICKSTART_PREPARE_ONLY="1",
    )
    proc = subprocess.run(
        ["bash", "exp_scripts/quickstart.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[:2] for c in calls] == [["-m", "verl.trainer.fsdp_sft_trainer"]]
    assert (qs / "warm_sft_3" / "final" / "config.json").exists()
    assert f"inputs ready: model {qs}/warm_sft_3/final" in proc.stdout
