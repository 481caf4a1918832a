"""ExGRPO's experience pool in the memory plan: a driver host-RAM line bounded by the run's steps and keys
(luffy_pool/memory_plan/host.py)."""

from __future__ import annotations

import os

from luffy_pool import memory_plan as mp
from luffy_pool.config.compose import compose_config
from luffy_pool.memory_plan.__main__ import main as cli
from luffy_pool.memory_plan.launch_script import script_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXGRPO, TRAIN = (os.path.join(ROOT, "exp_scripts", s) for s in ("train_exgrpo.sh", "train.sh"))
GiB = 2**30


def _plan(script, *extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "EXP_NAME")}
    return mp.plan_for_config(compose_config(script_overrides(script, list(extra), env=env)), mp.parse_gpu_memory("80"))


def test_train_exgrpo_plans_its_pool_after_701_steps():
    (line,) = _plan(EXGRPO).host_lines
    # 701 steps x 128 groups x min(rbound 7, n - 1 = 7, cap 8) trajectories x (8 B x (8,192 tokens + the EOS's
    # log-prob) + 280 B of headers) = 41,343,791,104 B
    assert line.bytes == 701 * 128 * 7 * (8 * 8193 + 280) == 41_343_791_104
    assert line.key == "algorithm.exgrpo.max_trajectories_per_question"
    assert line.what.startswith("ExGRPO experience pool after 701 steps (128 groups x 7 trajectories x 8,192 tokens")
    assert "8 per question" in line.what and "full-length bound" in line.what


def test_the_cap_and_the_step_count_bound_it():
    (capped,) = _plan(EXGRPO, "algorithm.exgrpo.max_trajectories_per_question=2").host_lines
    assert capped.bytes == 701 * 128 * 2 * (8 * 8193 + 280) and "2 per question" in capped.what
    (free,) = _plan(EXGRPO, "algorithm.exgrpo.max_trajectories_per_question=0").host_lines
    assert free.bytes == 701 * 128 * 7 * (8 * 8193 + 280) and "no cap" in free.what
    (unknown,) = _plan(EXGRPO, "trainer.total_training_steps=null").host_lines
    assert unknown.bytes == 128 * 7 * (8 * 8193 + 280) and "per step" in unknown.what
    assert not _plan(TRAIN).host_lines  # no other method keeps a growing pool on the driver


def test_the_cli_prints_it_apart_from_the_device_phases(capsys):
    assert cli([EXGRPO, "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("driver host RAM: ")]
    assert line.endswith(": 38.50 GiB (algorithm.exgrpo.max_trajectories_per_question)")
