"""Every shipped launch script exp_scripts/train*.sh passes its own memory plan on an 80 GB GPU (the 5 % margin, no
refusal) and runs with trainer.memory_plan=error; a script the plan does not cover says in one ``# GPU:`` line which
GPU it needs, and the plan's command line quotes it."""

from __future__ import annotations

import glob
import json
import os

import pytest

from luffy_pool.config.compose import compose_config
from luffy_pool.memory_plan.__main__ import main as cli
from luffy_pool.memory_plan.launch_script import gpu_line, script_overrides
from luffy_pool.run.recipe import read_recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "exp_scripts", "train*.sh")))
MODEL_CONFIGS = os.path.join(ROOT, "tests", "data", "model_configs")


def _env(monkeypatch, tmp_path, script):
    for name in (
        "MODEL_PATH",
        "DATA_DIR",
        "EXP_NAME",
        "MODEL_OVERRIDES",
        "NCCL_NVLS_ENABLE",
        "VLLM_ALLREDUCE_USE_SYMM_MEM",
    ):
        monkeypatch.delenv(name, raising=False)
    if os.path.basename(script) == "train_sft_rl.sh":  # it starts from train_sft.sh's output: a 7B SFT folder
        folder = tmp_path / "sft_final"
        folder.mkdir()
        with open(os.path.join(MODEL_CONFIGS, "Qwen--Qwen2.5-Math-7B.json")) as f:
            (folder / "config.json").write_text(json.dumps(json.load(f)))
        monkeypatch.setenv("MODEL_PATH", str(folder))
    return dict(os.environ)


def test_the_scripts_are_found():
    names = {os.path.basename(s) for s in SCRIPTS}
    assert {"train.sh", "train_16k.sh", "train_async.sh", "train_exgrpo.sh", "train_sft.sh", "train_sft_rl.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_every_launch_script_fits_80_gb_or_names_its_gpu(script, monkeypatch, tmp_path, capsys):
    env = _env(monkeypatch, tmp_path, script)
    recipe = read_recipe(script, env)
    rc = cli([script, "--gpu-memory", "80"])
    out, err = capsys.readouterr()
    if recipe.kind != "rl":  # the SFT trainer: no plan, one line naming the GPU
        need = gpu_line(script)
        assert need.startswith("GPU: ") and "80 GB" in need
        assert rc == 2 and err.strip().count("\n") == 0 and need in err
        return
    assert rc == 0, out[-1500:]
    assert "<--" not in out and "note:" not in out  # no phase under the margin, no refusal
    cfg = compose_config(script_overrides(script, env=env))
    assert cfg.trainer.memory_plan == "error"
