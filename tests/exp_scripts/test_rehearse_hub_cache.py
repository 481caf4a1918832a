"""H9: a rehearsal resolves a hub id through a hub-layout HF cache, as the workers do (verl/utils/model_source.py):
MODEL_PATH=Qwen/Qwen2.5-Math-7B, HF_HUB_CACHE holding ``models--Qwen--Qwen2.5-Math-7B/refs/main`` and
``snapshots/<hash>/config.json``, HF_HUB_OFFLINE=1. The dry-run reads the real config.json from the snapshot, says
so, lists the fields it kept, and carries the CPU warnings in its REHEARSAL report. Quick: no training."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
REAL = os.path.join(REPO, "tests", "data", "model_configs", "Qwen--Qwen2.5-Math-7B.json")
MODEL_ID = "Qwen/Qwen2.5-Math-7B"
REVISION = "a" * 8 + "0123456789abcdef0123456789abcdef"  # a commit hash: 40 hex digits


def _hub_cache(root) -> str:
    """A hub-layout cache holding only MODEL_ID's config.json; the path of that snapshot file."""
    entry = os.path.join(root, "models--" + MODEL_ID.replace("/", "--"))
    snapshot = os.path.join(entry, "snapshots", REVISION)
    os.makedirs(snapshot)
    os.makedirs(os.path.join(entry, "refs"))
    with open(os.path.join(entry, "refs", "main"), "w") as f:
        f.write(REVISION)
    shutil.copyfile(REAL, os.path.join(snapshot, "config.json"))
    return os.path.join(snapshot, "config.json")


def _dry_run(tmp_path, hub):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
        LUFFY_VENV=os.path.dirname(os.path.dirname(sys.executable)),
        MODEL_PATH=MODEL_ID,
        HF_HUB_CACHE=str(hub),
        HF_HUB_OFFLINE="1",
    )
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [
            "bash",
            os.path.join(EXP, "rehearse.sh"),
            os.path.join(EXP, "train.sh"),
            "--work",
            str(tmp_path / "work"),
            "--dry-run",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REHEARSAL ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout, json.loads(lines[-1][len("REHEARSAL ") :])


@pytest.mark.slow  # a rehearsal dry run in a subprocess (~10 s)
def test_hub_id_resolves_through_the_hub_cache_and_keeps_the_real_fields(tmp_path):
    config = _hub_cache(tmp_path / "hub")
    out, report = _dry_run(tmp_path, tmp_path / "hub")
    m = report["model"]
    assert m["was"] == MODEL_ID and m["hub_cache"] == str(tmp_path / "hub")
    assert m["real_config"] == m["family_from"] == config and m["model_type"] == "qwen2"
    assert f"model id {MODEL_ID} resolved through the hub cache {tmp_path / 'hub'}" in out
    assert f"model config {config}:" in out
    kept, shrunk = m["config_fields"]["kept"], m["config_fields"]["shrunk"]
    assert {"rope_theta", "tie_word_embeddings", "rms_norm_eps", "sliding_window", "use_sliding_window"} <= set(kept)
    assert shrunk["num_hidden_layers"][0] == 28 and shrunk["vocab_size"][0] == 152064
    with open(os.path.join(m["now"], "config.json")) as f:
        tiny = json.load(f)
    rope_theta = tiny.get("rope_theta", (tiny.get("rope_parameters") or {}).get("rope_theta"))  # newer transformers
    assert tiny["model_type"] == "qwen2" and rope_theta == 10000 and tiny["tie_word_embeddings"] is False
    # the CPU's warnings travel in the same report
    assert "actor_rollout_ref.model.use_remove_padding=true" in report["gpu_only"]
    assert "WARNING GPU-only switch, not in effect on cpu: actor_rollout_ref.model.use_remove_padding=true" in out


def test_hub_id_missing_from_the_cache_falls_back_to_the_name(tmp_path, monkeypatch):
    from luffy_pool.run.recipe import read_recipe
    from luffy_pool.run.rehearse import model_family, plan

    os.makedirs(tmp_path / "empty")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_family(MODEL_ID) == ("qwen2", f"the name {MODEL_ID!r}")
    recipe = read_recipe(os.path.join(EXP, "train.sh"), dict(os.environ, MODEL_PATH=MODEL_ID))
    assert plan(recipe, str(tmp_path / "work"))[2]["model"]["hub_cache"] is None
    # the same id, once in that cache, resolves to its snapshot (the workers' own lookup, read when called)
    config = _hub_cache(tmp_path / "empty")
    assert model_family(MODEL_ID) == ("qwen2", config)
    assert plan(recipe, str(tmp_path / "work"))[2]["model"]["hub_cache"] == str(tmp_path / "empty")
