"""Recipe rehearsal: every launch script of exp_scripts/ runs 2 steps on CPU with its own switches.

Unit part (quick loop): reading a script through its own command line, discovery, the plan's scaled
lengths and divisible heads. e2e part: ``bash exp_scripts/rehearse.sh <script>`` for every script that
``discover_launch_scripts`` finds (a script added later is rehearsed without editing this file), each
checked for exit code 0 and two logged training steps with finite losses. The rehearsals share what is
not theirs to check: the tiny models and task data (``--cache``: built once per model spec) and one Ray
instance the RL scripts join (``--ray-address``, as a run joins a cluster); each script still starts its
own driver and workers. Two rehearsals run at a time (``Rehearsals``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from luffy_pool.run.recipe import RecipeError, discover_launch_scripts, divisible_heads, read_recipe, rehearsal_world

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
SCRIPTS = discover_launch_scripts(EXP)
CONFIGS = os.path.join(REPO, "tests", "data", "model_configs")
# The world each rehearsal runs on. train.sh and train_16k.sh set the parallel layouts (vLLM TP 2; SP 2 x TP 2):
# they rehearse on 4 ranks, two DP groups of that layout (the weight sync reaches two engines, SP groups sit
# inside DP). A script built on them changes no parallel key (test_scripts_built_on_train_sh_keep_its_layout),
# so its rehearsal checks its own switches on the smallest world that holds the layout: 2 ranks (40 % of the
# CPU of a 4-rank rehearsal, measured on train.sh: 64 s against 107 s).
LAYOUT_RANKS = {"train.sh": 4, "train_16k.sh": 4, "train_32b.sh": 8}
# train_32b.sh (actor TP 4, vLLM TP 4; ACTOR_PP=2 pipelines it) rehearses every parallel dimension of the actor at once:
# 8 ranks as tp 2 x pp 2 x dp 2 (two vLLM engines of TP 4), its shrunk Qwen2.5-32B having 2 layers, one per stage.
LAYOUT_OVERRIDES = {
    "train_32b.sh": (
        "actor_rollout_ref.actor.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.pipeline_model_parallel_size=2",
    )
}


@dataclass(frozen=True)
class Case:
    """One rehearsal: a launch script, the extra arguments of rehearse.sh, and its world."""

    id: str
    script: str
    args: tuple = ()  # rehearse.sh options
    overrides: tuple = ()  # Hydra overrides appended to the script's (right after the script: argparse positionals)
    resume: bool = False  # a second rehearsal resumes from the first one's step-1 checkpoint and trains step 2

    @property
    def ranks(self) -> int:
        return LAYOUT_RANKS.get(os.path.basename(self.script), 2)


# The model matrix (issue #34): every rehearsal shrinks a published config.json (tests/data/model_configs),
# keeping all its non-size fields. A script rehearses on its own model's config (train.sh names LUFFY's
# Elliott/Qwen2.5-Math-7B-16k-think), or on the model this table gives it: each model LUFFY users train goes
# through train.sh's switches (the scripts below exec train.sh and keep its model switches: remove padding,
# gradient checkpointing, the chunked head, meta-device init, the vLLM TP 2 weight sync), and the two 16k
# models through train_16k.sh's (SP 2 x TP 2). Qwen3-30B-A3B (MoE) rehearses through train_moe.sh, its own script.
MATRIX = {
    "train_hpt.sh": "Qwen--Qwen2.5-Math-1.5B",  # tied embeddings
    "train_srft.sh": "Qwen--Qwen3-8B-Base",  # qwen3: q/k norms, head_dim apart from hidden/heads
    "train_chord.sh": "deepseek-ai--DeepSeek-R1-Distill-Qwen-1.5B",
    # llama3 rope scaling, distinct bos/eos, no qkv bias, and no pad token (its tokenizer_config.json beside it)
    "train.sh": "meta-llama--Llama-3.1-8B",
    "train_rl_sft_loss.sh": "Qwen--Qwen2.5-Math-7B",  # LUFFY's base model itself (4,096 positions; lengths shrunk)
}
EXTRA = [("train_16k.sh", "Qwen--Qwen3-8B")]
# Qwen3 through train_16k.sh also resumes (SP 2 x TP 2 shards written by 4 ranks, read by 4 new ones). One resumed
# case is enough for that path: the model only changes the tensors, and each leg costs a 4-rank rehearsal.
RESUMED = {("train_16k.sh", "Qwen--Qwen3-8B")}


@functools.lru_cache(maxsize=None)
def own_config(script: str):
    """The config file of the model a script names (hub id owner/name -> owner--name.json), if tests/data has it."""
    try:
        model = read_recipe(script, {k: v for k, v in os.environ.items() if k != "MODEL_PATH"}).model_path
    except RecipeError:  # train_sft_rl.sh refuses until train_sft.sh made its model: a local folder, no hub config
        return None
    name = str(model).replace("/", "--") if model and str(model).count("/") == 1 else None
    # config_only/: the large models stored without their token files (tests/data/model_configs/README.md)
    found = [n for n in (name, f"config_only/{name}") if name and os.path.isfile(os.path.join(CONFIGS, n + ".json"))]
    return found[0] if found else None


def _case(script: str, config) -> Case:
    base = os.path.basename(script)
    if config is None:
        return Case(base, script)
    label = base if config == own_config(script) else f"{base}@{config.split('--', 1)[1]}"
    resume = (base, config) in RESUMED
    return Case(
        label,
        script,
        ("--model-config", os.path.join(CONFIGS, config + ".json")),
        LAYOUT_OVERRIDES.get(base, ()) + (("trainer.save_freq=1",) if resume else ()),
        resume,
    )


# train_moe.sh rehearses in full on its shrunk Qwen3-30B-A3B (4 experts, top-2; the HF engine rolls out on CPU,
# luffy_pool/run/rehearse.py), train_32b.sh as LAYOUT_OVERRIDES says; tests/exp_scripts/test_rehearse_large.py
# checks the large-model recipes' memory plans and their rehearsals' composed configs (dry runs).
CASES = [_case(s, MATRIX.get(os.path.basename(s)) or own_config(s)) for s in SCRIPTS] + [
    _case(os.path.join(EXP, script), config) for script, config in EXTRA
]


def test_discovery_finds_every_shipped_launch_script_and_no_helper():
    names = {os.path.basename(s) for s in SCRIPTS}
    assert {
        "train.sh",
        "train_16k.sh",
        "train_on_policy.sh",
        "train_rl_sft_loss.sh",
        "train_sft_rl.sh",
        "train_sft.sh",
    } <= names
    assert not names & {"quickstart.sh", "setup_venv.sh", "rehearse.sh"}


def test_model_matrix_puts_every_model_of_issue_34_through_train_sh_and_the_16k_models_through_train_16k_sh():
    env = dict(os.environ, MODEL_PATH="org/model")

    def keys(script):
        return [o.split("=", 1)[0] for o in read_recipe(script, env).overrides]

    layouts = {name: keys(os.path.join(EXP, name)) for name in ("train.sh", "train_16k.sh")}
    through = {name: set() for name in layouts}
    for case in CASES:
        overrides = keys(case.script)
        for name, base in layouts.items():
            if case.args and overrides[: len(base)] == base:  # the script runs the layout script's switches first
                through[name].add(os.path.basename(case.args[1])[: -len(".json")])
    assert {
        "Qwen--Qwen2.5-Math-7B",
        "Qwen--Qwen2.5-Math-1.5B",
        "meta-llama--Llama-3.1-8B",
        "Qwen--Qwen3-8B-Base",
        "deepseek-ai--DeepSeek-R1-Distill-Qwen-1.5B",
    } <= through["train.sh"], through
    assert {"Elliott--Qwen2.5-Math-7B-16k-think", "Qwen--Qwen3-8B"} <= through["train_16k.sh"], through
    assert len({c.id for c in CASES}) == len(CASES)


def test_discovery_follows_exec_chains(tmp_path):
    (tmp_path / "base.sh").write_text('"$PYTHON" -m verl.mix_src.main_mix_ppo a=1 "$@"\n')
    (tmp_path / "child.sh").write_text('exec bash "$(dirname "$0")/base.sh" b=2 "$@"\n')
    (tmp_path / "grandchild.sh").write_text('exec bash "$HERE/child.sh" "$@"\n')
    (tmp_path / "other.sh").write_text('.venv/bin/python -m luffy_pool.main_mix_ppo\n')
    assert [os.path.basename(s) for s in discover_launch_scripts(str(tmp_path))] == [
        "base.sh",
        "child.sh",
        "grandchild.sh",
    ]


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
    assert (
        list(report["gpu_only"])[0] == "actor_rollout_ref.rollout.enforce_eager=false"
    )  # the others: test_rehearse_warnings.py
    assert not any("enforce_eager" in o for o in overrides)  # not overridden: the CPU engine builder runs it eager
    print_report(report, overrides)
    assert (
        "WARNING GPU-only switch, not in effect on cpu: actor_rollout_ref.rollout.enforce_eager=false"
        in capsys.readouterr().out
    )
    eager = read_recipe(os.path.join(EXP, "train.sh"), args=("actor_rollout_ref.rollout.enforce_eager=True",))
    assert not any("enforce_eager" in k for k in plan(eager, str(tmp_path))[2]["gpu_only"])  # LUFFY's eager engine


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
    assert (
        L["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] * 2
        >= L["data.max_prompt_length"] + L["data.max_response_length"]
    )
    assert (
        L["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"]
        == 2 * L["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]
    )
    assert env["MODEL_PATH"] == report["model"]["now"] and env["WANDB_MODE"] == "offline"
    assert "trainer.device=cpu" in overrides and "trainer.n_gpus_per_node=4" in overrides
    # nothing the script switches on is overridden: only lengths, batch sizes, device, world, steps, outputs
    switched = {o.split("=", 1)[0] for o in overrides}
    allowed = (
        set(report["lengths"])
        | set(report["batches"])
        | {
            "trainer.device",
            "trainer.nnodes",
            "trainer.n_gpus_per_node",
            "trainer.total_training_steps",
            "trainer.default_local_dir",
            "hydra.run.dir",
        }
    )
    assert switched <= allowed, switched - allowed


def test_cache_builds_inputs_once_per_spec_and_copies_them(tmp_path, monkeypatch):
    import luffy_pool.tiny as tiny
    from luffy_pool.run.rehearse import build_inputs

    built = []

    def fake_model(folder, spec, model_config=None, real_tokens=None):
        built.append(("model", spec.num_attention_heads))
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, "config.json"), "w").write(json.dumps({"heads": spec.num_attention_heads}))

    monkeypatch.setattr(tiny, "build_tiny_model", fake_model)
    cache = str(tmp_path / "cache")

    def report(work, heads):
        return {
            "model": {
                "now": str(tmp_path / work / "model"),
                "num_attention_heads": heads,
                "num_key_value_heads": 2,
                "model_type": "qwen2",
                "was": "the script's model",
            },
            "data": {"now": str(tmp_path / work / "data") + " (tiny arithmetic task)"},
        }

    for work, heads in (("a", 4), ("b", 4), ("c", 8)):
        build_inputs(report(work, heads), cache=cache)
    assert built == [("model", 4), ("model", 8)]  # one build per spec, the second rehearsal of a spec copies
    assert json.load(open(tmp_path / "b" / "model" / "config.json")) == {"heads": 4}
    assert json.load(open(tmp_path / "c" / "model" / "config.json")) == {"heads": 8}
    for work in "abc":  # the data set is built once and every rehearsal gets the files LUFFY's scripts read
        assert {"openr1.parquet", "valid.parquet", "openr1.complement.parquet"} <= set(
            os.listdir(tmp_path / work / "data")
        )
    assert sorted(n.split("-")[0] for n in os.listdir(cache)) == ["data", "model", "model"]


def test_plan_joins_a_given_ray_for_rl_scripts_only(tmp_path):
    from luffy_pool.run.rehearse import plan

    env, _, report = plan(read_recipe(os.path.join(EXP, "train.sh")), str(tmp_path), ray_address="10.0.0.1:6379")
    assert env["RAY_ADDRESS"] == report["ray"] == "10.0.0.1:6379"
    env, _, report = plan(read_recipe(os.path.join(EXP, "train.sh")), str(tmp_path))
    assert "RAY_ADDRESS" not in env and report["ray"] == "a local instance of its own"
    env, _, report = plan(read_recipe(os.path.join(EXP, "train_sft.sh")), str(tmp_path), ray_address="10.0.0.1:6379")
    assert "RAY_ADDRESS" not in env and report["ray"].startswith("none")


STEP_LINE = re.compile(r"^step:(\d+) - (.*)$", re.M)


def _rehearsal_env() -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
        LUFFY_VENV=os.path.dirname(os.path.dirname(sys.executable)),
    )
    env.pop("RAY_ADDRESS", None)
    return env


class Rehearsals:
    """Runs the selected rehearsals two at a time, in test order, from the first request on.

    A rehearsal leaves part of the 2 cores idle (its driver's start-up is one process; the workers'
    collectives wait on each other), so the next script's rehearsal starts while this one runs. Each keeps its
    own folder, driver and workers; the two share the input cache and Ray instance."""

    def __init__(self, cases, folders, cache: str, ray_address: str, jobs: int = 2):
        self.folders = folders
        self.pool = ThreadPoolExecutor(jobs)
        # the longest first (a resume leg, then 4 ranks): the last one left running would otherwise be the longest
        order = sorted(cases, key=lambda c: (not c.resume, -c.ranks))
        self.futures = {c.id: self.pool.submit(self._run, c, folders[c.id], cache, ray_address) for c in order}

    @staticmethod
    def _run(case, work, cache, ray_address):
        def rehearse(folder, *extra):
            return subprocess.run(
                [
                    "bash",
                    os.path.join(EXP, "rehearse.sh"),
                    case.script,
                    *case.overrides,
                    *extra,
                    *case.args,
                    "--work",
                    folder,
                    "--ranks",
                    str(case.ranks),
                    "--cache",
                    cache,
                    "--ray-address",
                    ray_address,
                ],
                env=_rehearsal_env(),
                capture_output=True,
                text=True,
                timeout=1400,
                cwd=work,
            )

        first = rehearse(work)
        if not case.resume or first.returncode != 0:
            return first, None
        return first, rehearse(
            os.path.join(work, "resumed"), f"trainer.resume_mode={os.path.join(work, 'out', 'global_step_1')}"
        )

    def result(self, case):
        return self.futures[case.id].result(), self.folders[case.id]

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def rehearsals(request, tmp_path_factory):
    """The rehearsals of the selected cases, sharing an input cache and one Ray instance."""
    from luffy_pool.run.rehearse import CPU_SAFE_ENV
    from tests.helpers.shared_ray import SharedRay

    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_rehearse_launch_script"
    ] or CASES
    folders = {c.id: str(tmp_path_factory.mktemp("rehearse_" + re.sub(r"\W", "_", c.id))) for c in selected}
    cache = str(tmp_path_factory.mktemp("rehearsal_cache"))
    with SharedRay(num_cpus=8, env=dict(_rehearsal_env(), **CPU_SAFE_ENV), cwd=REPO) as ray:
        runs = Rehearsals(selected, folders, cache, ray.address)
        try:
            yield runs, ray.address
        finally:
            runs.close()


def test_scripts_built_on_train_sh_keep_its_layout():
    """The 2-rank rehearsals (LAYOUT_RANKS) rest on this: a script that is not a layout script sets the
    parallel layout of train.sh (SP 1, vLLM TP 2) or none (SFT)."""
    base = read_recipe(os.path.join(EXP, "train.sh"))
    for case in CASES:
        r = read_recipe(case.script, dict(os.environ, MODEL_PATH="org/model"))
        if case.ranks == 2 and r.kind == "rl":
            assert (r.sp, r.tp) == (base.sp, base.tp), case.id
        assert rehearsal_world(r.sp, r.tp, case.ranks) == case.ranks, case.id  # the world holds the layout


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rehearse_launch_script(case, rehearsals):
    runs, ray_address = rehearsals
    (proc, resumed), _ = runs.result(case)
    script = case.script
    out = proc.stdout
    lines = [line for line in out.splitlines() if line.startswith("REHEARSAL ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{out[-4000:]}\n{proc.stderr[-6000:]}"
    report = json.loads(lines[-1][len("REHEARSAL ") :])
    assert report["rc"] == 0 and report["steps"] == 2 and report["world"]["now"] == case.ranks
    if case.args:  # the real config shrunk: its model_type and every non-size field reach the tiny model
        with open(case.args[1]) as f:
            real = json.load(f)
        kept = report["model"]["config_fields"]["kept"]
        assert report["model"]["model_type"] == real["model_type"] and {"tie_word_embeddings", "rope_theta"} <= set(
            kept
        )
        assert {"rope_scaling"} & set(real) <= set(kept) and report["model"]["real_config"] == case.args[1]
    assert "replaced (cannot exist here)" in out  # the list is printed before the script runs
    steps = {int(m.group(1)): dict(kv.split(":", 1) for kv in m.group(2).split(" - ")) for m in STEP_LINE.finditer(out)}
    recipe = read_recipe(script, dict(os.environ, MODEL_PATH=report["model"]["now"]))
    if recipe.kind == "rl" and recipe.get("trainer.val_before_train"):  # as its authors' (train_hpt.sh, ...)
        before = steps.pop(0, {})  # the validation before step 1: validation metrics only
        assert before and all(k.startswith("val/") for k in before), out[-3000:]
    assert sorted(steps) == [1, 2], out[-3000:]
    kind = recipe.kind
    assert report["ray"] == (ray_address if kind == "rl" else "none (torchrun)")
    if kind == "sft":
        # the SFT trainer writes its final HF folder (what train_sft_rl.sh starts from)
        assert os.path.isfile(os.path.join(report["outputs"], "out", "final", "config.json"))
        return
    for metrics in steps.values():
        assert math.isfinite(float(metrics["actor/pg_loss"])) and math.isfinite(float(metrics["actor/grad_norm"]))
    if os.path.basename(script) == "train_moe.sh":  # the routers' aux loss and load logged; the HF engine rolled out
        assert all(float(m["actor/moe_load_max_over_mean"]) >= 1.0 for m in steps.values()), out[-3000:]
        assert all(math.isfinite(float(m["actor/moe_aux_loss"])) for m in steps.values())
        assert "  rollout: vllm -> hf (MoE on CPU" in out
    if LAYOUT_OVERRIDES.get(os.path.basename(script)):  # the trainer ran the layout it was given (tp x pp x dp 2)
        from omegaconf import OmegaConf

        resolved = OmegaConf.load(os.path.join(report["outputs"], "out", "resolved_config.yaml"))
        for override in LAYOUT_OVERRIDES[os.path.basename(script)]:
            key, value = override.split("=")
            assert OmegaConf.select(resolved, key) == int(value), override
    if os.path.basename(script) == "train_relift.sh":  # its scaled SFT buffer fills: the SFT stage ran and was saved
        actor = os.path.join(report["outputs"], "out", "global_step_2", "actor")
        assert json.load(open(os.path.join(actor, "checkpoint_meta.json")))["extra_optimizers"] == {"sft": True}
    if os.path.basename(script) == "train_sdpo.sh":  # its EMA teacher (the reference weights) is in the checkpoint
        from verl.utils.checkpoint.layout import extra_state_file
        from verl.utils.checkpoint.safe_io import load_state

        actor = os.path.join(report["outputs"], "out", "global_step_2", "actor")
        extras = load_state(os.path.join(actor, extra_state_file(case.ranks, 0)))["extras"]
        assert extras["ref_weights"]["shards"], sorted(extras)
    if case.resume:
        # the result as an HF model: the best checkpoint's export, gathered from the SP x TP shards, loads in transformers
        from transformers import AutoModelForCausalLM

        best = os.path.join(report["outputs"], "out", "best", "actor")
        assert AutoModelForCausalLM.from_pretrained(best).config.model_type == real["model_type"]
        # 4 new ranks resume from the step-1 checkpoint and train step 2
        again = resumed.stdout + resumed.stderr
        assert resumed.returncode == 0, again[-6000:]
        assert re.search(r"resumed from \S*global_step_1 .*continuing at step 2 of", again), again[-4000:]
        steps = {
            int(m.group(1)): dict(kv.split(":", 1) for kv in m.group(2).split(" - "))
            for m in STEP_LINE.finditer(resumed.stdout)
        }
        assert sorted(steps) == [2] and math.isfinite(float(steps[2]["actor/pg_loss"])), resumed.stdout[-3000:]
