"""Every baseline of LUFFY's comparison keeps working: its tiny CPU config, its GPU launch script, one real step.

Fast checks: each ``luffy_pool/config/tiny_cpu_*.yaml`` composes with the method's settings and shares
model, data, steps, batch, lr and seeds with ``tiny_cpu_luffy.yaml``; the GPU launchers
``train_rl_sft_loss.sh`` / ``train_sft_rl.sh`` compose LUFFY's settings (``--cfg job``, no training).
End to end (``e2e``): each RL config trains one step through the real trainer (1 rank, HF rollout) and
logs the method's signature (on-policy: no trace in any group; RL w/ SFT loss: an NLL term; LUFFY: the
off-policy weight is f(p) = p/(p+0.1), without shaping it is p); SFT runs 2 steps of ``run_sft`` and
SFT then RL starts one RL step from exactly the SFT output folder.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG_DIR = os.path.join(REPO, "luffy_pool", "config")
RL_CONFIGS = (
    "tiny_cpu_on_policy",
    "tiny_cpu_rl_sft_loss",
    "tiny_cpu_luffy_no_shaping",
    "tiny_cpu_luffy",
    "tiny_cpu_sft_rl",
    "tiny_cpu_luffy_replay",
)
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."

# What makes each method what it is (docs/METHOD.md §2.3, §6), as composed config values.
METHOD_KEYS = {
    "tiny_cpu_on_policy": {
        R + "min_prefix_ratio": 0.0,
        R + "max_prefix_ratio": 0.0,
        A + "use_off_policy_loss": False,
        A + "use_sft_multitask_loss": False,
        A + "loss_remove_clip": False,
        A + "off_policy_reshape": "no_reshape",
        "algorithm.adv_estimator": "grpo",
    },
    "tiny_cpu_rl_sft_loss": {
        R + "min_prefix_ratio": 1.0,
        R + "max_prefix_ratio": 1.0,
        R + "n_prefix": 1,
        A + "use_off_policy_loss": False,
        A + "use_sft_multitask_loss": True,
        A + "sft_loss_coef": 1.0,
        A + "loss_remove_clip": True,
        A + "loss_remove_token_mean": True,
        "algorithm.adv_estimator": "grpo_split",
    },
    "tiny_cpu_luffy_no_shaping": {
        R + "min_prefix_ratio": 1.0,
        R + "n_prefix": 1,
        A + "use_off_policy_loss": True,
        A + "off_policy_reshape": "no_reshape",
        A + "loss_remove_clip": True,
        "algorithm.adv_estimator": "grpo",
    },
    "tiny_cpu_luffy": {
        R + "min_prefix_ratio": 1.0,
        R + "n_prefix": 1,
        A + "use_off_policy_loss": True,
        A + "off_policy_reshape": "p_div_p_0.1",
        A + "loss_remove_clip": True,
        "algorithm.adv_estimator": "grpo",
    },
    "tiny_cpu_luffy_replay": {
        R + "min_prefix_ratio": 1.0,
        R + "n_prefix": 1,
        A + "use_off_policy_loss": True,
        A + "off_policy_reshape": "p_div_p_0.1",
        A + "use_off_policy_probs": True,
        "data.self_replay.enable": True,
        "data.self_replay.slots": 1,
    },
    "tiny_cpu_sft_rl": {
        R + "min_prefix_ratio": 0.0,
        R + "max_prefix_ratio": 0.0,
        A + "use_off_policy_loss": False,
        A + "loss_remove_clip": False,
        "actor_rollout_ref.model.path": "outputs/quickstart/sft/final",
    },
}
# Shared with tiny_cpu_luffy.yaml by every RL baseline: "same model, data, steps and seeds".
SHARED_KEYS = (
    "data.train_files",
    "data.val_files",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "data.seed",
    "data.reward_impl_version",
    R + "n",
    R + "temperature",
    R + "seed",
    R + "max_prefix_len",
    A + "optim.lr",
    A + "ppo_mini_batch_size",
    A + "entropy_coeff",
    "algorithm.grpo_use_std",
    "trainer.total_training_steps",
    "trainer.seed",
    "trainer.n_gpus_per_node",
)


def _compose(config_name: str, overrides=()):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


@functools.lru_cache(maxsize=None)
def _composed(config_name: str):
    """The config as the YAML files define it (cached: the fast tests only read it)."""
    return _compose(config_name)


def _compose_sft(overrides=()):
    """tiny_cpu_sft.yaml on top of the SFT trainer's YAML (as ``--config-dir luffy_pool/config`` does)."""
    from verl.trainer.sft.config import CONFIG_DIR as SFT_CONFIG_DIR

    return _compose("tiny_cpu_sft", [f"hydra.searchpath=[file://{SFT_CONFIG_DIR}]", *overrides])


def _get(cfg, dotted: str):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, dotted, throw_on_missing=True)


# ---------------------------------------------------------------------- configs (fast)
@pytest.mark.parametrize("config_name", RL_CONFIGS)
def test_tiny_baseline_config_sets_the_methods_keys_and_passes_the_config_check(config_name):
    from luffy_pool.config.check import check_config

    cfg = _composed(config_name)
    for key, expected in METHOD_KEYS[config_name].items():
        assert _get(cfg, key) == expected, key
    check_config(cfg)
    assert cfg.trainer.experiment_name == config_name
    others = {_composed(c).trainer.default_local_dir for c in RL_CONFIGS if c != config_name}
    assert cfg.trainer.default_local_dir not in others, "runs must not share a metrics file"


@pytest.mark.parametrize("config_name", [c for c in RL_CONFIGS if c != "tiny_cpu_luffy"])
def test_tiny_baseline_config_shares_model_data_steps_and_seeds_with_tiny_luffy(config_name):
    luffy, cfg = _composed("tiny_cpu_luffy"), _composed(config_name)
    for key in SHARED_KEYS:
        assert _get(cfg, key) == _get(luffy, key), key
    if config_name != "tiny_cpu_sft_rl":
        assert cfg.actor_rollout_ref.model.path == luffy.actor_rollout_ref.model.path


def test_tiny_sft_config_matches_the_rl_runs_data_steps_and_optimizer():
    luffy, sft = _composed("tiny_cpu_luffy"), _compose_sft()
    assert sft.data.train_files == luffy.data.train_files
    assert sft.model.path == luffy.actor_rollout_ref.model.path
    assert sft.data.train_batch_size == luffy.data.train_batch_size
    assert sft.trainer.total_training_steps == luffy.trainer.total_training_steps
    assert sft.optim.lr == luffy.actor_rollout_ref.actor.optim.lr
    assert list(sft.optim.betas) == list(luffy.actor_rollout_ref.actor.optim.betas)
    assert sft.optim.weight_decay == luffy.actor_rollout_ref.actor.optim.weight_decay
    assert sft.data.max_length >= luffy.data.max_prompt_length + luffy.data.max_response_length
    # SFT then RL starts from this run's final folder.
    assert _composed("tiny_cpu_sft_rl").actor_rollout_ref.model.path == f"{sft.trainer.default_local_dir}/final"


# ---------------------------------------------------------------------- GPU launch scripts (--cfg job)
def _script_config(script: str, env_extra: dict, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, **env_extra)
    return subprocess.run(
        ["bash", os.path.join(REPO, "exp_scripts", script), *args, "--cfg", "job"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def _yaml_of(proc: subprocess.CompletedProcess):
    from omegaconf import OmegaConf

    assert proc.returncode == 0, proc.stderr[-3000:]
    return OmegaConf.create(proc.stdout)


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_train_rl_sft_loss_sh_composes_luffys_rl_with_sft_loss_run(tmp_path):
    cfg = _yaml_of(_script_config("train_rl_sft_loss.sh", {"ROOT": str(tmp_path)}))
    expected = dict(METHOD_KEYS["tiny_cpu_rl_sft_loss"])
    expected.update(
        {
            R + "n": 8,
            "data.train_batch_size": 128,
            "data.max_response_length": 8192,
            "algorithm.grpo_use_std": False,
            "trainer.experiment_name": "LUFFY_RL_with_SFT_LOSS",
            "data.train_files": f"{tmp_path}/data/openr1.parquet",
        }
    )
    for key, value in expected.items():
        assert _get(cfg, key) == value, key


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_train_rl_sft_loss_sh_passes_extra_arguments_last(tmp_path):
    cfg = _yaml_of(
        _script_config("train_rl_sft_loss.sh", {"ROOT": str(tmp_path)}, "actor_rollout_ref.actor.sft_loss_coef=0.5")
    )
    assert cfg.actor_rollout_ref.actor.sft_loss_coef == 0.5


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_train_sft_rl_sh_composes_on_policy_grpo_from_the_sft_model_on_the_complement(tmp_path):
    sft = tmp_path / "sft_final"
    sft.mkdir()
    (sft / "config.json").write_text("{}")
    cfg = _yaml_of(_script_config("train_sft_rl.sh", {"ROOT": str(tmp_path), "MODEL_PATH": str(sft)}))
    expected = {
        "actor_rollout_ref.model.path": str(sft),
        "data.train_files": f"{tmp_path}/data/openr1.complement.parquet",
        R + "min_prefix_ratio": 0.0,
        R + "max_prefix_ratio": 0.0,
        A + "loss_remove_clip": False,
        A + "off_policy_reshape": "no_reshape",
        "algorithm.adv_estimator": "grpo",
        R + "n": 8,
        "trainer.experiment_name": "SFT_RL",
    }
    for key, value in expected.items():
        assert _get(cfg, key) == value, key


def test_train_sft_rl_sh_without_the_sft_model_says_to_run_train_sft_first(tmp_path):
    proc = _script_config("train_sft_rl.sh", {"ROOT": str(tmp_path)})
    assert proc.returncode == 2
    assert f"{tmp_path}/checkpoints/luffy-math-test/SFT/final" in proc.stderr and "train_sft.sh" in proc.stderr


# ---------------------------------------------------------------------- one real step per baseline (e2e)
def _one_step_overrides(model_dir: str, task_dir: str, out_dir: str) -> list[str]:
    """The tiny config at test size: 2 prompts x 4 samples, 1 rank, HF rollout, 1 step, no validation."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={task_dir}/train.parquet",
        f"data.val_files={task_dir}/test.parquet",
        "data.train_batch_size=2",
        "data.max_prompt_length=96",
        "data.max_response_length=48",
        R + "max_prefix_len=48",
        R + "n=4",
        R + "name=hf",
        A + "ppo_mini_batch_size=2",
        A + "ppo_micro_batch_size=2",
        "reward.num_workers=1",
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=1",
        "trainer.test_freq=-1",
        "+trainer.val_before_train=False",
        "trainer.logger=['console','jsonl']",
        f"trainer.default_local_dir={out_dir}",
    ]


def _train_one_step(config_name: str, overrides: list[str], out_dir) -> tuple[dict, list[float]]:
    """Train 1 step; returns (the logged metrics row, the actor weight fingerprint before training)."""
    from luffy_pool.config.check import check_config, prepare_overrides
    from luffy_pool.run.launcher import build_trainer
    from omegaconf import OmegaConf

    cfg = _compose(config_name, prepare_overrides(overrides))
    check_config(cfg)
    OmegaConf.resolve(cfg)
    trainer, close = build_trainer(cfg)
    try:
        before = trainer.wg.actor_weight_fingerprint()
        trainer.fit()
    finally:
        close()
        # Free this run's CPU bundles so the next baseline fits in the session's Ray instance.
        trainer.wg.shutdown()
        trainer.wg.resource_pool.release()
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1]
    for key, value in rows[0].items():
        if isinstance(value, float):
            assert math.isfinite(value), key
    return rows[0], before


def _assert_on_policy_only(row: dict) -> None:
    assert row["batch/avg_prefix_ratio"] == 0.0
    assert row["rollout/full_trace_slots"] == 0
    assert row["on_off_metrics/off_on_example_ratio"] == 0.0
    assert "actor/off_policy_prob" not in row and "actor/sft_loss" not in row
    assert "actor/pg_clipfrac" in row  # verl's PPO loss, clip active


def _assert_one_trace_per_group(row: dict) -> None:
    assert row["rollout/full_trace_slots"] == 2  # one slot of each of the 2 prompts
    assert row["batch/avg_prefix_ratio"] == pytest.approx(0.25)  # 1 of n=4 slots at ratio 1
    assert row["on_off_metrics/off_on_example_ratio"] == pytest.approx(1 / 3)
    assert row["on_off_metrics/off_score"] == 1.0  # the synthetic task's traces are correct


@pytest.mark.e2e
def test_on_policy_config_trains_one_step_without_any_off_policy_row(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session
):
    row, _ = _train_one_step(
        "tiny_cpu_on_policy", _one_step_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path)), tmp_path
    )
    _assert_on_policy_only(row)


@pytest.mark.e2e
def test_rl_sft_loss_config_trains_one_step_with_an_nll_term_on_the_trace(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session
):
    row, _ = _train_one_step(
        "tiny_cpu_rl_sft_loss", _one_step_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path)), tmp_path
    )
    _assert_one_trace_per_group(row)
    # NLL of a random 512-token model on the trace: about ln(512) = 6.2 nats per token.
    assert 1.0 < row["actor/sft_loss"] < 20.0
    assert "actor/off_policy_prob" not in row


@pytest.mark.e2e
@pytest.mark.parametrize("config_name", ["tiny_cpu_luffy_no_shaping", "tiny_cpu_luffy"])
def test_luffy_configs_train_one_step_with_their_off_policy_weight(
    config_name, tiny_model_dir, tiny_task_dir, tmp_path, ray_session
):
    row, _ = _train_one_step(config_name, _one_step_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path)), tmp_path)
    _assert_one_trace_per_group(row)
    p, weight = row["actor/off_policy_prob"], row["actor/off_ratio_mean"]
    assert 0.0 < p < 0.1  # a random model gives the trace's tokens little probability
    if config_name == "tiny_cpu_luffy_no_shaping":
        assert weight == pytest.approx(p, rel=1e-5)  # weight = p itself
    else:
        # f(p) = p/(p+0.1): above p for p < 0.9, and (concave) at most f(mean p).
        assert p * 2 < weight <= p / (p + 0.1) + 1e-6


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir, tiny_task_dir, tmp_path_factory):
    """2 steps of run_sft on tiny_cpu_sft.yaml with the test's model and data."""
    from verl.trainer.fsdp_sft_trainer import run_sft

    out = tmp_path_factory.mktemp("sft")
    cfg = _compose_sft(
        [
            f"model.path={tiny_model_dir}",
            f"data.train_files={tiny_task_dir}/train.parquet",
            "data.train_batch_size=4",
            "data.micro_batch_size_per_gpu=2",
            "trainer.total_training_steps=2",
            f"trainer.default_local_dir={out}",
        ]
    )
    return run_sft(cfg)


@pytest.mark.e2e
def test_sft_config_trains_two_steps_and_writes_the_final_hf_folder(sft_run):
    assert [h["step"] for h in sft_run["history"]] == [1, 2]
    assert all(0.0 < h["train/loss"] < 20.0 for h in sft_run["history"])
    final = sft_run["final_model_dir"]
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        assert os.path.exists(os.path.join(final, name)), name
    rows = [json.loads(line) for line in open(os.path.join(os.path.dirname(final), "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2]


@pytest.mark.e2e
def test_sft_rl_config_trains_one_on_policy_step_from_the_sft_weights(
    sft_run, tiny_model_dir, tiny_task_dir, tmp_path, ray_session
):
    import torch
    from transformers import AutoModelForCausalLM

    final = sft_run["final_model_dir"]
    overrides = _one_step_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path))
    overrides = [o for o in overrides if not o.startswith("actor_rollout_ref.model.path=")] + [
        f"actor_rollout_ref.model.path={final}"
    ]
    row, before = _train_one_step("tiny_cpu_sft_rl", overrides, tmp_path)
    _assert_on_policy_only(row)

    def sum_of_squares(path: str) -> float:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return sum(float(p.detach().double().pow(2).sum()) for p in model.parameters())

    assert before[0] == pytest.approx(sum_of_squares(final), rel=1e-9)
    assert before[0] != pytest.approx(sum_of_squares(tiny_model_dir), rel=1e-6)
