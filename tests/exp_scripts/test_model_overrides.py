"""exp_scripts/overrides/<model>.txt through MODEL_OVERRIDES: train.sh appends the file's lines after its own switches
and before the extra arguments, and with them Qwen3-8B and Llama-3.1-8B fit an 80 GB GPU with the 5 % margin and a
vLLM KV demand under 1.2x the cache (without them: under the margin and 2.9-3.3x)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from luffy_pool import memory_plan as mp
from luffy_pool.config.compose import compose_config
from luffy_pool.config.sections import ConfigSections
from luffy_pool.memory_plan.__main__ import main as cli
from luffy_pool.memory_plan.launch_script import LaunchScriptError, script_overrides
from luffy_pool.memory_plan.report import rollout_rows_per_engine

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN = os.path.join(ROOT, "exp_scripts", "train.sh")
OVERRIDES = os.path.join(ROOT, "exp_scripts", "overrides")
# override file -> the published config.json it is sized for (tests/data/model_configs)
MODELS = {"Qwen3-8B": "Qwen--Qwen3-8B.json", "Llama-3.1-8B": "meta-llama--Llama-3.1-8B.json"}


def _model_dir(tmp_path, config_name):
    folder = tmp_path / config_name.replace(".json", "")
    folder.mkdir()
    with open(os.path.join(ROOT, "tests", "data", "model_configs", config_name)) as f:
        (folder / "config.json").write_text(json.dumps(json.load(f)))
    return str(folder)


def _env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "MODEL_PATH",
            "DATA_DIR",
            "EXP_NAME",
            "MODEL_OVERRIDES",
            "NCCL_NVLS_ENABLE",
            "VLLM_ALLREDUCE_USE_SYMM_MEM",
        )
    }
    env.update(extra)
    return env


def _plan(env, *extra):
    cfg = compose_config(script_overrides(TRAIN, list(extra), env=env))
    plan = mp.plan_for_config(cfg, mp.parse_gpu_memory("80"))
    live = min(plan.inputs.max_num_seqs, rollout_rows_per_engine(ConfigSections.from_config(cfg)))
    return plan, live * plan.inputs.max_len / plan.kv_cache_tokens


def _file_lines(name):
    with open(os.path.join(OVERRIDES, f"{name}.txt")) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


def test_every_override_file_is_tested_and_documented():
    files = sorted(n[:-4] for n in os.listdir(OVERRIDES) if n.endswith(".txt"))
    assert files == sorted(MODELS)
    readme = open(os.path.join(OVERRIDES, "README.md")).read()
    assert all(f"`{name}.txt`" in readme for name in files)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_overrides_fit_80_gb_with_kv_demand_under_1_2x(name, tmp_path, monkeypatch, capsys):
    model = _model_dir(tmp_path, MODELS[name])
    bare, bare_ratio = _plan(_env(MODEL_PATH=model))
    assert bare.over(0.05) and bare_ratio > 2.8  # why the file exists: train.sh's switches alone
    plan, ratio = _plan(_env(MODEL_PATH=model, MODEL_OVERRIDES=name))
    assert not plan.over(0.05) and not plan.notes
    assert ratio < 1.2 and plan.inputs.gpu_memory_utilization == 0.72
    assert plan.inputs.max_num_seqs == {"Qwen3-8B": 72, "Llama-3.1-8B": 80}[name]
    # the command line a user runs: exit 0 and a KV-demand line that fits
    for key, value in _env(MODEL_PATH=model, MODEL_OVERRIDES=name).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.delenv("VLLM_ALLREDUCE_USE_SYMM_MEM", raising=False)
    assert cli([TRAIN, "--gpu-memory", "80"]) == 0
    demand = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("vLLM KV demand: "))
    assert demand.endswith("in the cache: fits")


def test_the_file_goes_after_the_scripts_switches_and_before_the_extra_arguments(tmp_path):
    custom = tmp_path / "mine.txt"
    custom.write_text("# a comment\n\n  actor_rollout_ref.rollout.max_num_seqs=48  \ntrainer.nnodes=2\n")
    o = script_overrides(TRAIN, ["trainer.nnodes=3"], env=_env(MODEL_OVERRIDES=str(custom)))
    assert o[-3:] == ["actor_rollout_ref.rollout.max_num_seqs=48", "trainer.nnodes=2", "trainer.nnodes=3"]
    assert o.index("trainer.memory_plan=error") < o.index("actor_rollout_ref.rollout.max_num_seqs=48")
    o = script_overrides(TRAIN, env=_env(MODEL_OVERRIDES="Qwen3-8B"))
    assert o[-len(_file_lines("Qwen3-8B")) :] == _file_lines("Qwen3-8B")
    # a wrapper's own arguments still win over the file (they are train.sh's "$@")
    o = script_overrides(os.path.join(ROOT, "exp_scripts", "train_16k.sh"), env=_env(MODEL_OVERRIDES="Qwen3-8B"))
    assert o.index("actor_rollout_ref.rollout.gpu_memory_utilization=0.72") < o.index(
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.7"
    )


def test_a_relative_path_from_the_callers_directory_and_a_missing_file(tmp_path):
    (tmp_path / "o.txt").write_text("actor_rollout_ref.rollout.max_num_seqs=40\n")
    proc = subprocess.run(
        ["bash", TRAIN, "--cfg", "job"],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        env=_env(MODEL_OVERRIDES="o.txt", PYTHON="echo"),
        timeout=60,
    )
    assert proc.returncode == 0 and "actor_rollout_ref.rollout.max_num_seqs=40" in proc.stdout
    with pytest.raises(LaunchScriptError, match="MODEL_OVERRIDES=nope: no such file, nor exp_scripts/overrides/nope"):
        script_overrides(TRAIN, env=_env(MODEL_OVERRIDES="nope"))
