"""``python -m luffy_pool.run.main_ppo``: the trainer with the off-policy pool switched off (no trace reaches a group,
verl's PPO loss); the user's overrides still win. One subprocess each; ``--cfg job`` prints the composed config."""

import os
import subprocess
import sys

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PATHS = ["data.train_files=/d/train.parquet", "data.val_files=/d/valid.parquet", "actor_rollout_ref.model.path=/m"]


def _job(*overrides) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "luffy_pool.run.main_ppo", *PATHS, *overrides, "--cfg", "job"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return yaml.safe_load(proc.stdout)


def test_the_on_policy_entry_point_sets_prefix_ratio_zero_and_the_ppo_loss_and_overrides_win():
    cfg = _job("actor_rollout_ref.rollout.n=4")
    actor, rollout = cfg["actor_rollout_ref"]["actor"], cfg["actor_rollout_ref"]["rollout"]
    assert (rollout["min_prefix_ratio"], rollout["max_prefix_ratio"], rollout["n"]) == (0.0, 0.0, 4)
    assert actor["use_off_policy_loss"] is False and actor["policy_loss"] == "auto"
    assert (
        _job("actor_rollout_ref.rollout.max_prefix_ratio=0.5")["actor_rollout_ref"]["rollout"]["max_prefix_ratio"]
        == 0.5
    )
