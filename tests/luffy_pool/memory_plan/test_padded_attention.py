"""H1 in the memory plan: with sdpa (no remove-padding) the plan says what the update costs at the padded width."""

from __future__ import annotations

import os

from luffy_pool import memory_plan as mp
from luffy_pool.config.compose import compose_config
from luffy_pool.memory_plan.__main__ import main as cli
from luffy_pool.memory_plan.launch_script import script_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TRAIN = os.path.join(ROOT, "exp_scripts", "train.sh")


def _config(*extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "EXP_NAME")}
    return compose_config(script_overrides(TRAIN, list(extra), env=env))


def test_sdpa_plan_shows_padded_rows_per_micro_batch(capsys):
    assert cli([TRAIN, "--gpu-memory", "80", "--", "actor_rollout_ref.model.attn_implementation=sdpa"]) == 0
    out = capsys.readouterr().out
    # train.sh: width 1,024 + 8,192; budget 32,768 -> 3 whole padded rows per micro-batch
    line = next(ln for ln in out.splitlines() if "remove-padding is off" in ln)
    assert "(actor_rollout_ref.model.attn_implementation=sdpa)" in line
    assert "3 padded rows x 9,216 = 27,648 positions" in line


def test_auto_plan_names_the_flash_attn_fallback_and_flash_says_nothing():
    plan = mp.plan_for_config(_config(), mp.parse_gpu_memory("80"))
    assert not plan.notes  # information, not a problem: train.sh still fits
    line = next(ln for ln in mp.render(plan).splitlines() if ln.startswith("attention: "))
    assert line.startswith("attention: if flash-attn does not import on the workers") and "falls back to sdpa" in line
    flash = mp.plan_for_config(
        _config("actor_rollout_ref.model.attn_implementation=flash_attention_2"), mp.parse_gpu_memory("80")
    )
    assert "remove-padding" not in mp.render(flash)


def test_budget_below_one_padded_row_is_refused_with_the_override():
    plan = mp.plan_for_config(
        _config(
            "actor_rollout_ref.model.attn_implementation=sdpa", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192"
        ),
        mp.parse_gpu_memory("80"),
    )
    msg = "\n".join(mp.over_budget_message(plan))
    assert "9,216 positions > actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8,192" in msg
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu>=9216" in msg
