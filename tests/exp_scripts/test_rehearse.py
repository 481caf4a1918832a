"""Recipe rehearsal: every launch script of exp_scripts/ runs 2 steps on CPU with its own switches.

Unit part (quick loop): reading a script through its own command line, discovery, the plan's scaled
lengths and divisible heads. e2e part: ``bash exp_scripts/rehearse.sh <script>`` for every script that
``discover_launch_scripts`` finds (a script added later is rehearsed without editing this file), each
checked for exit code 0 and two logged training steps with finite losses.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from luffy_pool.run.recipe import discover_launch_scripts, divisible_heads, read_recipe, rehearsal_world

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
SCRIPTS = discover_launch_scripts(EXP)


def test_discovery_finds_every_shipped_launch_script_and_no_helper():
    names = {os.path.basename(s) for s in SCRIPTS}
    assert {"train.sh", "train_16k.sh", "train_on_policy.sh", "train_rl_sft_loss.sh", "train_sft_rl.sh",
            "train_sft.sh"} <= names
    assert not names & {"quickstart.sh", "setup_venv.sh", "rehearse.sh"}


def test_discovery_follows_exec_chains(tmp_path):
    (tmp_path / "base.sh").write_text('"$PYTHON" -m verl.mix_src.main_mix_ppo a=1 "$@"\n')
    (tmp_path / "child.sh").write_text('exec bash "$(dirname "$0")/base.sh" b=2 "$@"\n')
    (tmp_path / "grandchild.sh").write_text('exec bash "$HERE/child.sh" "$@"\n')
    (tmp_path / "other.sh").write_text('.venv/bin/python -m luffy_pool.main_mix_ppo\n')
    assert [os.path.basename(s) for s in discover_launch_scripts(str(tmp_path))] == [
        "base.sh", "child.sh", "grandchild.sh"]


def test_read_recipe_runs_the_script_chain_and_keeps_override_order():
    r = read_recipe(os.path.join(EXP, "train_16k.sh"), dict(os.environ, MODEL_PATH="org/model"))
    assert r.module == "verl.mix_src.main_mix_ppo" and r.kind == "rl"
    # train.sh's own value first, train_16k.sh's after it: the later one wins, as in Hydra
    idx = [i for i, o in enumerate(r.overrides) if o.startswith("data.max_response_length=")]
    assert [r.overrides[i] for i in idx] == ["data.max_response_length=8192", "data.max_response_length=15360"]
    assert r.values["data.max_response_length"] == "15360" and r.model_path == "org/model"
    assert (r.sp, r.tp, r.world) == (2, 2, 8)
    sw = r.switches()
    assert sw["gradient_checkpointing"] and sw["remove_padding"] and sw["dynamic_bsz"] and sw["ref_param_offload"]
    sft = read_recipe(os.path.join(EXP, "train_sft.sh"))
    assert sft.kind == "sft" and sft.launcher_args["--nproc_per_node"] == "8" and sft.world == 8


def test_heads_and_world_divide_by_sp_and_tp():
    for sp, tp in ((1, 1), (1, 2), (2, 2), (4, 2), (3, 2), (8, 1)):
        heads, kv = divisible_heads(sp, tp)
        assert heads % sp == heads % tp == kv % sp == kv % tp == 0 and kv >= 2
        world = rehearsal_world(sp, tp)
        assert world >= 4 and world % sp == world % tp == 0


def test_plan_names_the_gpu_only_graphs_switch_train_sh_sets(tmp_path, capsys):
    from luffy_pool.run.rehearse import plan, print_report

    _, overrides, report = plan(read_recipe(os.path.join(EXP, "train.sh")), str(tmp_path))
    assert list(report["gpu_only"]) == ["actor_rollout_ref.rollout.enforce_eager=false"]
    assert not any("enforce_eager" in o for o in overrides)  # not overridden: the CPU engine builder runs it eager
    print_report(report, overrides)
    assert "WARNING GPU-only switch, not in effect on cpu: actor_rollout_ref.rollout.enforce_eager=false" \
        in capsys.readouterr().out
    eager = read_recipe(os.path.join(EXP, "train.sh"), args=("actor_rollout_ref.rollout.enforce_eager=True",))
    assert plan(eager, str(tmp_path))[2]["gpu_only"] == {}  # LUFFY's eager engine: nothing to warn about


def test_plan_scales_every_length_by_one_factor(tmp_path):
    from luffy_pool.run.rehearse import KEPT_ON_CPU, plan

    r = read_recipe(os.path.join(EXP, "train_16k.sh"))
    env, overrides, report = plan(r, str(tmp_path))
    factor = report["length_factor"]
    assert factor == 32 and report["lengths"]
    for key, (was, now) in report["lengths"].items():
        assert now * factor == was, key  # one factor for every length: the script's ratios hold
        assert f"{key}={now}" in overrides
    assert not set(KEPT_ON_CPU) & set(report["lengths"])
    # train_16k.sh's invariants, scaled: a full row fits SP x the update budget; log-prob budget = 2 x update
    L = dict((k, v[1]) for k, v in report["lengths"].items())
    assert L["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] * 2 >= L["data.max_prompt_length"] + L[
        "data.max_response_length"]
    assert L["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == 2 * L[
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]
    assert env["MODEL_PATH"] == report["model"]["now"] and env["WANDB_MODE"] == "offline"
    assert "trainer.device=cpu" in overrides and "trainer.n_gpus_per_node=4" in overrides
    # nothing the script switches on is overridden: only lengths, batch sizes, device, world, steps, outputs
    switched = {o.split("=", 1)[0] for o in overrides}
    allowed = set(report["lengths"]) | set(report["batches"]) | {
        "trainer.device", "trainer.nnodes", "trainer.n_gpus_per_node", "trainer.total_training_steps",
        "trainer.default_local_dir", "hydra.run.dir"}
    assert switched <= allowed, switched - allowed


STEP_LINE = re.compile(r"^step:(\d+) - (.*)$", re.M)


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("script", SCRIPTS, ids=[os.path.basename(s) for s in SCRIPTS])
def test_rehearse_launch_script(script, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               LUFFY_VENV=os.path.dirname(os.path.dirname(sys.executable)))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(["bash", os.path.join(EXP, "rehearse.sh"), script, "--work", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=1400, cwd=str(tmp_path))
    out = proc.stdout
    lines = [line for line in out.splitlines() if line.startswith("REHEARSAL ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{out[-4000:]}\n{proc.stderr[-6000:]}"
    report = json.loads(lines[-1][len("REHEARSAL "):])
    assert report["rc"] == 0 and report["steps"] == 2
    assert "replaced (cannot exist here)" in out  # the list is printed before the script runs
    steps = {int(m.group(1)): dict(kv.split(":", 1) for kv in m.group(2).split(" - ")) for m in STEP_LINE.finditer(out)}
    assert sorted(steps) == [1, 2], out[-3000:]
    if read_recipe(script, dict(os.environ, MODEL_PATH=report["model"]["now"])).kind == "sft":
        # the SFT trainer writes its final HF folder (what train_sft_rl.sh starts from)
        assert os.path.isfile(os.path.join(report["outputs"], "out", "final", "config.json"))
        return
    for metrics in steps.values():
        assert math.isfinite(float(metrics["actor/pg_loss"])) and math.isfinite(float(metrics["actor/grad_norm"]))
