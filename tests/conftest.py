"""Shared pytest fixtures: safe process env, the offline tiny model, its task data, one Ray session."""
from __future__ import annotations

import os

# Set before torch / ray / vllm are imported anywhere (CPU_STACK.md: 2 OpenMP threads collapse 8-20x
# when another process holds a core; Ray 2.60 token auth; in-process vLLM starts in ~3 s).
for _k, _v in {
    "OMP_NUM_THREADS": "1",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
}.items():
    os.environ.setdefault(_k, _v)

import pytest

SHARED_DATA = os.environ.get(
    "LUFFY_SHARED_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
)


@pytest.fixture(scope="session")
def shared_data_dir() -> str:
    path = os.path.abspath(SHARED_DATA)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"shared data not found at {path}; set LUFFY_SHARED_DATA")
    return path


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
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=True,
                 object_store_memory=512 * 1024 * 1024)
    yield ray
    ray.shutdown()
