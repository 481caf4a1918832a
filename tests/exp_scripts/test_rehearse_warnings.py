"""H9: a rehearsal names every switch of the recipe that the CPU turns off or makes a no-op (remove padding,
bf16, sleep/wake, flash-attn, CUDA graphs), read from the composed config: the script's overrides and the
YAML defaults it keeps. Quick: plans only, no training."""

from __future__ import annotations

import json
import os

import pytest

from luffy_pool.run.recipe import read_recipe

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
PREFIX = "WARNING GPU-only switch, not in effect on cpu: "
# train.sh sets remove padding, graphs, sleep level 2 and free_cache_engine; it keeps the YAML's attention
# (auto) and actor dtype (auto = bf16 on cuda); its reference is off (ref.use_ref=False), so no ref dtype.
EXPECTED = [
    "actor_rollout_ref.rollout.enforce_eager=false",
    "actor_rollout_ref.model.use_remove_padding=true",
    "actor_rollout_ref.model.attn_implementation=auto",
    "actor_rollout_ref.actor.fsdp_config.param_dtype=auto",
    "actor_rollout_ref.rollout.free_cache_engine=true",
    "actor_rollout_ref.rollout.sleep_level=2",
]


def _warnings(tmp_path, capsys, script, args=()):
    from luffy_pool.run.rehearse import plan, print_report

    _, overrides, report = plan(read_recipe(os.path.join(EXP, script), args=args), str(tmp_path))
    print_report(report, overrides)
    printed = [line.strip()[len(PREFIX) :] for line in capsys.readouterr().out.splitlines() if PREFIX in line]
    json.dumps(report)  # the REHEARSAL line carries them
    return report, overrides, printed


@pytest.mark.parametrize("script", ["train.sh", "train_16k.sh"])
def test_every_switch_the_cpu_turns_off_is_warned_and_reported(tmp_path, capsys, script):
    report, _, printed = _warnings(tmp_path, capsys, script)
    assert list(report["gpu_only"]) == EXPECTED
    assert [line.split(": ", 1)[0] for line in printed] == EXPECTED  # one WARNING line each, in report order
    why = report["gpu_only"]
    assert "no varlen kernel" in why["actor_rollout_ref.model.use_remove_padding=true"]
    assert "fp32 on cpu" in why["actor_rollout_ref.actor.fsdp_config.param_dtype=auto"]
    assert "no-op off cuda" in why["actor_rollout_ref.rollout.free_cache_engine=true"]
    assert "sdpa on cpu" in why["actor_rollout_ref.model.attn_implementation=auto"]


def test_warnings_follow_the_recipe_not_a_list_per_script(tmp_path, capsys):
    # the same script with the switches changed on its command line: each warning goes or changes with them
    args = (
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.actor.fsdp_config.param_dtype=fp32",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.model.attn_implementation=flash_attention_2",
        "actor_rollout_ref.ref.use_ref=True",
    )
    report, overrides, printed = _warnings(tmp_path, capsys, "train.sh", args)
    assert list(report["gpu_only"]) == [
        "actor_rollout_ref.rollout.enforce_eager=false",
        "actor_rollout_ref.model.attn_implementation=flash_attention_2",
    ]
    assert "actor_rollout_ref.model.attn_implementation=sdpa" in overrides  # what the warning says replaced it
    assert len(printed) == 2
    # the reference's dtype follows the actor's by interpolation: with the actor at auto and a reference, both warn
    report, _, _ = _warnings(tmp_path, capsys, "train.sh", ("actor_rollout_ref.ref.use_ref=True",))
    assert "actor_rollout_ref.ref.fsdp_config.param_dtype=auto" in report["gpu_only"]
    # sleep_level matters only with free_cache_engine
    report, _, _ = _warnings(tmp_path, capsys, "train.sh", ("actor_rollout_ref.rollout.free_cache_engine=False",))
    assert not any("sleep_level" in k or "free_cache_engine" in k for k in report["gpu_only"])
