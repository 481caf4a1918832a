"""Shared pytest fixtures: safe process env, the offline tiny model, its task data, one Ray session."""

from __future__ import annotations

import os

# Set before torch / ray / vllm are imported anywhere (docs/CPU_STACK.md §5.3, §4, §7.1: 2 OpenMP threads collapse 8-20x
# when another process holds a core; Ray 2.60 token auth; in-process vLLM starts in ~3 s).
for _k, _v in {
    "OMP_NUM_THREADS": "1",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
    # A Ray instance started for a test (ray_session, or a trainer subprocess's own) would start idle task
    # workers for its first driver, ~3 CPU-s per start; the trainers run actors, which get workers of their own.
    "RAY_prestart_worker_first_driver": "0",
    # The suite's speed-ups, outside the product (dev/luffy_pool_dev, as tests/run.sh sets them): each worker rank
    # imports its class with the collector paused (forked from a zygote too with LUFFY_FORK_WORKERS=1), and the CPU
    # engines of this process and its children run the vLLM plugin's speed-ups.
    "VERL_ACTOR_RUNTIME_ENV_HOOK": "luffy_pool_dev.fork_workers:actor_runtime_env",
    "LUFFY_DEV_SPEEDUPS": "1",
}.items():
    os.environ.setdefault(_k, _v)

import sys

import pytest

# Shared test helpers import as ``tests.helpers.*``: the repository root must be importable (``python -m pytest``
# puts it there; the ``pytest`` script does not under --import-mode=importlib).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

try:
    from luffy_pool_dev.startup_gc import end_startup, pause_for_startup
except ModuleNotFoundError as err:  # the entry point of its vLLM plugin needs the install, not only the path
    raise ModuleNotFoundError(
        "the development package is not installed in this venv: bash exp_scripts/setup_venv.sh "
        "(or pip install --no-deps --no-build-isolation -e dev)"
    ) from err

# Collection imports every test module (torch, transformers, vLLM, Ray: ~20 CPU-s in each xdist worker) with the
# cyclic collector paused; what it built is frozen when collection ends (dev/luffy_pool_dev/startup_gc.py).
pause_for_startup()


def pytest_collection_finish(session):
    end_startup()


@pytest.fixture(scope="session")
def repo_data_dir() -> str:
    """The real data the repository ships (data/benchmarks, data/gsm8k; sources in data/README.md)."""
    return os.path.join(_ROOT, "data")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A freshly built tiny Qwen2 + tokenizer folder (random seeded weights), once per session."""
    from luffy_pool.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def tiny_task_dir(tmp_path_factory) -> str:
    """Synthetic arithmetic task parquets (train/test) in LUFFY's training format."""
    from luffy_pool.tiny import write_task_parquets

    out = str(tmp_path_factory.mktemp("tiny_task"))
    write_task_parquets(out, n_train=64, n_test=16, level=2, seed=0)
    return out


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole session; never attaches to someone else's cluster."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=8,
            include_dashboard=False,
            log_to_driver=True,
            object_store_memory=512 * 1024 * 1024,
        )
    yield ray
    ray.shutdown()


# Per-test limit of unit tests (the quick loop); e2e / slow / vllm tests get pytest.ini's `timeout` (900 s).
UNIT_TEST_TIMEOUT_S = 300
HEAVY_MARKERS = ("e2e", "slow", "vllm")


def pytest_collection_modifyitems(config, items):
    """slow and vllm tests belong to the e2e tier, so the quick loop `-m "not e2e"` leaves them out;
    every other test runs under the tighter unit-test timeout unless it sets its own."""
    for item in items:
        heavy = [m for m in HEAVY_MARKERS if item.get_closest_marker(m) is not None]
        if heavy and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
        if not heavy and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TEST_TIMEOUT_S))


def tiny_overrides(model_dir, task_dir, out_dir, rollout="hf", steps=3):
    """A small LUFFY run: n=4 with one full-trace slot per prompt, LUFFY's loss settings.

    Rule: nothing here turns off a switch that mix_ppo_trainer.yaml or a shipped recipe turns on
    (gradient checkpointing stays on, as in the YAML, train.sh and train_16k.sh) unless its line says why.
    """
    return [
        f"data.train_files={task_dir}/train.parquet",
        f"data.val_files={task_dir}/test.parquet",
        "data.train_batch_size=4",
        "data.max_prompt_length=96",
        "data.max_response_length=48",
        "data.val_max_rows=8",
        "data.reward_impl_version=3",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size=2",
        "actor_rollout_ref.actor.use_off_policy_loss=True",
        "actor_rollout_ref.actor.off_policy_reshape=p_div_p_0.1",
        "actor_rollout_ref.actor.loss_remove_token_mean=True",
        "actor_rollout_ref.actor.loss_remove_clip=True",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.max_prefix_len=48",
        "actor_rollout_ref.rollout.n_prefix=1",
        "actor_rollout_ref.rollout.min_prefix_ratio=1.0",
        "actor_rollout_ref.rollout.max_prefix_ratio=1.0",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # the HF engine is one rank per engine
        # off in the YAML's verl defaults' place because LUFFY's train.sh turns them off: no reference, no KL, no std
        "actor_rollout_ref.ref.use_ref=False",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.n_val=1",
        "algorithm.adv_estimator=grpo",
        "algorithm.grpo_use_std=False",
        "algorithm.kl_ctrl.kl_coef=0.0",
        "reward.num_workers=1",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=2",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=2",
        "trainer.save_freq=-1",
        "trainer.logger=['console','jsonl']",
        f"trainer.default_local_dir={out_dir}",
        "+trainer.val_before_train=False",
        "trainer.project_name=e2e",
        "trainer.experiment_name=tiny",
    ]


def _compose_config(overrides, config_name: str = "mix_ppo_trainer"):
    """The trainer config as ``main_mix_ppo`` composes it, without running Hydra's app."""
    from luffy_pool.config.compose import compose_config

    return compose_config(overrides, config_name)


@pytest.fixture(scope="session")
def luffy_overrides():
    """``luffy_overrides(model_dir, task_dir, out_dir, rollout="hf", steps=3)``: a tiny LUFFY run's overrides."""
    return tiny_overrides


@pytest.fixture(scope="session")
def compose_config():
    """``compose_config(overrides, config_name="mix_ppo_trainer")`` -> the composed trainer config."""
    return _compose_config
