"""The trainer's command line as users type it: LUFFY's scripts, Hydra's flags, error exits.

Each test is one subprocess (~2 s of imports); none trains. ``--cfg job`` prints the composed config,
which is how the override lists are checked without the Ray launcher.
"""

import os
import shlex
import subprocess
import sys

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LUFFY_ENV = {"MODEL_PATH": "/models/qwen", "DATA_DIR": "/data", "PYTHON": sys.executable}
PATHS = ["data.train_files=/d/train.parquet", "data.val_files=/d/valid.parquet", "actor_rollout_ref.model.path=/m"]


def run(args, env=None, timeout=120):
    return subprocess.run(
        args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {}))
    )


def trainer(*args, module="luffy_pool.main_mix_ppo", **kw):
    return run([sys.executable, "-m", module, *args], **kw)


def train_sh_overrides() -> list[str]:
    """exp_scripts/train.sh's overrides as bash expands them (LUFFY_ENV paths)."""
    text = open(os.path.join(REPO, "exp_scripts", "train.sh")).read()
    body = text.split("-m verl.mix_src.main_mix_ppo", 1)[1].split('"${LUFFY_TRAINER[@]}"', 1)[0].replace("\\\n", " ")
    for var in ("MODEL_PATH", "DATA_DIR", "WANDB_PROJECT", "EXP_NAME"):
        body = body.replace(
            f"${var}", {"WANDB_PROJECT": "luffy-math-test", "EXP_NAME": "LUFFY_TEST"}.get(var, LUFFY_ENV.get(var, ""))
        )
    return shlex.split(body)


def assert_luffy_values(cfg: dict, experiment="LUFFY_TEST", gpu_memory_utilization=0.73):
    actor, rollout = cfg["actor_rollout_ref"]["actor"], cfg["actor_rollout_ref"]["rollout"]
    assert cfg["data"]["train_files"] == "/data/openr1.parquet" and cfg["data"]["max_response_length"] == 8192
    assert cfg["actor_rollout_ref"]["model"]["path"] == "/models/qwen"
    assert cfg["trainer"]["logger"] == ["console", "wandb"] and cfg["trainer"]["val_before_train"] is False
    assert cfg["trainer"]["experiment_name"] == experiment and cfg["trainer"]["project_name"] == "luffy-math-test"
    # The scripts pass 0.73, not LUFFY's 0.80 (train.sh's MEMORY_PLAN: vLLM 0.32's rule and its TP communicator
    # outside the fraction, docs/DESIGN.md §2 item 8)
    assert (rollout["n"], rollout["n_prefix"], rollout["name"], rollout["gpu_memory_utilization"]) == (
        8,
        1,
        "vllm",
        gpu_memory_utilization,
    )
    assert (actor["ppo_mini_batch_size"], actor["use_dynamic_bsz"], actor["loss_remove_token_mean"]) == (64, True, True)
    assert cfg["algorithm"] == {**cfg["algorithm"], "adv_estimator": "grpo", "grpo_use_std": False}


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_train_sh_runs_luffys_list_through_the_verl_mix_src_alias():
    proc = run(["bash", "exp_scripts/train.sh", "--cfg", "job"], env=LUFFY_ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "-m verl.mix_src.main_mix_ppo" in proc.stderr  # set -x trace: LUFFY's module path was used
    cfg = yaml.safe_load(proc.stdout)
    assert_luffy_values(cfg)
    assert cfg["actor_rollout_ref"]["actor"]["off_policy_reshape"] == "p_div_p_0.1"
    assert cfg["actor_rollout_ref"]["actor"]["loss_remove_clip"] is True


def test_luffy_list_with_unquoted_logger_parses_through_luffy_pool_module():
    # Unquoted in LUFFY's script, bash turns ['console','wandb'] into [console,wandb].
    overrides = [
        ("trainer.logger=[console,wandb]" if o.startswith("trainer.logger=") else o) for o in train_sh_overrides()
    ]
    proc = trainer(*overrides, "trainer.total_training_steps=500", "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert_luffy_values(cfg, gpu_memory_utilization=0.8)  # LUFFY's list alone: its own 0.80
    assert cfg["trainer"]["total_training_steps"] == 500  # extra arguments come last and win


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_train_on_policy_sh_turns_every_slot_on_policy_with_clip_active():
    proc = run(["bash", "exp_scripts/train_on_policy.sh", "--cfg", "job"], env=LUFFY_ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert_luffy_values(cfg, experiment="ON_POLICY_TEST")
    rollout, actor = cfg["actor_rollout_ref"]["rollout"], cfg["actor_rollout_ref"]["actor"]
    assert (rollout["min_prefix_ratio"], rollout["max_prefix_ratio"]) == (0.0, 0.0)
    assert (actor["off_policy_reshape"], actor["loss_remove_clip"]) == ("no_reshape", False)


def test_unknown_keys_exit_nonzero_with_the_closest_key_before_hydra_runs():
    proc = trainer(
        *PATHS,
        "actor_rollout_ref.actor.ppo_mini_batchsize=4",
        "+trainer.val_before_trian=False",
        "--cfg",
        "job",
        module="verl.mix_src.main_mix_ppo",
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        "Config error: Unknown config key 'actor_rollout_ref.actor.ppo_mini_batchsize'; "
        "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'?"
    ) in proc.stderr
    assert "did you mean 'trainer.val_before_train'?" in proc.stderr
    assert "Could not override" not in proc.stderr  # Hydra's own struct error never shows


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_bad_enum_value_stops_the_run_before_the_launcher(tmp_path):
    proc = trainer(*PATHS, "actor_rollout_ref.actor.off_policy_reshape=p_div_p_01", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        "'actor_rollout_ref.actor.off_policy_reshape'='p_div_p_01' is not one of: no_reshape, logp, p_logp, "
        "square_root, pow, p_div_p_0.1, p_div_p_0.3, p_div_p_0.5"
    ) in proc.stderr
    assert "launcher" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_multirun_runs_each_job_through_the_config_checks(tmp_path):
    proc = trainer(*PATHS[:1], "-m", "trainer.device=tpu,cpu", *PATHS[1:], f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Launching 2 jobs locally" in proc.stdout + proc.stderr
    assert "Config error: 'trainer.device'='tpu' is not one of: auto, cpu, cuda" in proc.stderr


def test_help_describes_the_trainer_and_its_keys():
    proc = trainer("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "luffy_pool.main_mix_ppo: LUFFY off-policy guided GRPO" in proc.stdout
    assert "ppo_mini_batch_size: 256" in proc.stdout and "off_policy_reshape: no_reshape" in proc.stdout


def test_multirun_with_cfg_job_previews_every_job_of_the_sweep():
    proc = trainer(*PATHS, "-m", "trainer.total_training_steps=1,2", "+trainer.val_before_train=False", "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-2000:]
    docs = proc.stdout.split("# multirun job ")[1:]
    assert [d.split(":", 1)[0] for d in docs] == ["0", "1"]
    steps = [yaml.safe_load(d.split("\n", 1)[1])["trainer"]["total_training_steps"] for d in docs]
    assert steps == [1, 2]
    assert "++trainer.val_before_train=False" in docs[0].splitlines()[0]


@pytest.mark.parametrize("warm_steps", ["0", "250"])
def test_quickstart_passes_extra_arguments_through_as_overrides(tmp_path, warm_steps):
    # Placeholders: the script only builds what is missing, and --cfg job never opens them.
    for name in (
        "model/config.json",
        "data/train.parquet",
        "data/test.parquet",
        "data/warm.parquet",
        "warm_sft_250/final/config.json",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    venv = os.path.dirname(os.path.dirname(sys.executable))
    proc = run(
        ["bash", "exp_scripts/quickstart.sh", "trainer.total_training_steps=3", "--cfg", "job"],
        env={
            "SKIP_SETUP": "1",
            "QUICKSTART_DIR": str(tmp_path),
            "LUFFY_VENV": venv,
            "QUICKSTART_WARM_STEPS": warm_steps,
        },
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["trainer"]["total_training_steps"] == 3
    # LUFFY starts from the SFT-warmed base unless the warm start is turned off.
    base = f"{tmp_path}/model" if warm_steps == "0" else f"{tmp_path}/warm_sft_250/final"
    assert cfg["actor_rollout_ref"]["model"]["path"] == base
    assert cfg["data"]["train_files"] == f"{tmp_path}/data/train.parquet"
    assert (cfg["trainer"]["device"], cfg["trainer"]["n_gpus_per_node"]) == ("cpu", 2)
    rollout = cfg["actor_rollout_ref"]["rollout"]
    assert (rollout["n"], rollout["n_prefix"], rollout["min_prefix_ratio"], rollout["max_prefix_ratio"]) == (
        8,
        1,
        1.0,
        1.0,
    )


@pytest.mark.parametrize("script", ["train.sh", "train_on_policy.sh", "quickstart.sh"])
def test_scripts_are_valid_bash(script):
    assert run(["bash", "-n", f"exp_scripts/{script}"]).returncode == 0


def test_overrides_go_before_flags_when_handed_to_hydra():
    from luffy_pool.run.main_mix_ppo import _argv_for_hydra

    argv = ["a=1", "-m", "+b=2", "--config-name", "tiny_cpu_luffy", "--info"]
    assert _argv_for_hydra(argv, ["a=1", "+b=2"], ["a=1", "++b=2"]) == [
        "a=1",
        "++b=2",
        "-m",
        "--config-name",
        "tiny_cpu_luffy",
        "--info",
    ]


def test_main_with_a_config_validates_before_importing_the_launcher():
    from hydra import compose, initialize_config_dir

    from luffy_pool.config.check import CONFIG_DIR, ConfigError
    from luffy_pool.run.main_mix_ppo import main

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("mix_ppo_trainer", overrides=PATHS + ["trainer.n_gpus_per_node=3"])
    with pytest.raises(ConfigError, match="do not split evenly over world size 3"):
        main(cfg)


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_preflight_problems_exit_2_with_one_line_each_before_any_model_loads(tmp_path):
    proc = trainer(
        *PATHS, f"trainer.default_local_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path}", "trainer.device=cpu"
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Config error: ")]
    assert errors == [
        "Config error: actor_rollout_ref.model.path=/m: the folder does not exist",
        "Config error: data.train_files: /d/train.parquet: file not found",
        "Config error: data.val_files: /d/valid.parquet: file not found",
    ]
    assert "Traceback" not in proc.stderr and "Repo id" not in proc.stderr
