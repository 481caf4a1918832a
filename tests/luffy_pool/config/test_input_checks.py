"""Issue 25: values that cannot work fail at the config check / pre-flight, one line naming the key."""

from __future__ import annotations

import pytest

from luffy_pool.config.check import validate_config
from luffy_pool.run.preflight import MAX_CPU_RANKS_PER_CORE, cluster_capacity_problem

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
PATHS = ["actor_rollout_ref.model.path=/m", "data.train_files=/t.parquet", "data.val_files=null"]


def _errors(compose_config, *overrides, name="tiny_cpu_luffy"):
    return validate_config(compose_config(PATHS + list(overrides), name))


def test_the_tiny_config_is_valid(compose_config):
    assert _errors(compose_config) == []


@pytest.mark.parametrize(
    "override, expected",
    [
        (f"{R}.temperature=inf", f"'{R}.temperature'=inf must be a finite number"),
        (f"{R}.temperature=nan", f"'{R}.temperature'=nan must be a finite number"),
        (f"{R}.temperature=0", f"'{R}.temperature'=0 must be > 0"),
        (f"{R}.top_p=nan", f"'{R}.top_p'=nan must be a finite number"),
        (f"{A}.clip_ratio=-inf", f"'{A}.clip_ratio'=-inf must be a finite number"),
        ("data.self_replay.slots=9", "'data.self_replay.slots'=9 exceeds 'actor_rollout_ref.rollout.n'=8"),
        (f"{A}.ppo_max_token_len_per_gpu=10", f"'{A}.ppo_max_token_len_per_gpu'=10 is below one sequence"),
        (f"{R}.log_prob_max_token_len_per_gpu=100", f"'{R}.log_prob_max_token_len_per_gpu'=100 is below one sequence"),
        ("reward.orm.enable=True reward.orm.model=m", "'reward.orm.enable'=True needs reward.orm.base_url"),
        (
            "data.max_response_length=100000000 actor_rollout_ref.actor.use_dynamic_bsz=False",
            "'data.max_response_length'=100000000 is beyond any model context",
        ),
    ],
)
def test_values_that_cannot_work_are_one_line_naming_the_key(compose_config, override, expected):
    extra = ["data.self_replay.enable=True", f"{A}.use_off_policy_probs=True"] if "self_replay" in override else []
    errors = _errors(compose_config, *override.split(), *extra)
    assert any(e.startswith(expected) for e in errors), errors
    assert all("\n" not in e for e in errors)


def test_self_replay_slots_equal_to_n_are_fine(compose_config):
    assert (
        _errors(
            compose_config, "data.self_replay.enable=True", f"{A}.use_off_policy_probs=True", "data.self_replay.slots=8"
        )
        == []
    )


def test_token_budget_is_checked_only_with_dynamic_batching(compose_config):
    assert (
        _errors(
            compose_config,
            f"{A}.use_dynamic_bsz=False",
            f"{A}.ppo_max_token_len_per_gpu=10",
            f"{R}.log_prob_max_token_len_per_gpu=10",
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=10",
        )
        == []
    )


@pytest.mark.parametrize(
    "nnodes, per_node, use_gpu, resources, cores, expected",
    [
        (
            1,
            64,
            False,
            {"CPU": 64.0},
            2,
            "trainer.nnodes x trainer.n_gpus_per_node = 1 x 64 = 64 ranks on CPU, but the "
            "Ray cluster has 0 GPU(s) and 2 CPU(s) on 1 node(s)",
        ),
        (
            2,
            8,
            True,
            {"CPU": 32.0, "GPU": 8.0},
            32,
            "trainer.nnodes x trainer.n_gpus_per_node = 2 x 8 = 16 ranks need 16 "
            "GPUs, but the Ray cluster has 8 GPU(s)",
        ),
        (1, 4, False, {"CPU": 2.0}, 2, "= 4 ranks need 4 CPU bundles, but the Ray cluster has 0 GPU(s) and 2 CPU(s)"),
        (1, 4, False, {"CPU": 4.0}, 2, None),  # the tests' 4 CPU ranks on 2 cores
        (2, 2, True, {"CPU": 4.0, "GPU": 4.0}, 4, None),
    ],
)
def test_cluster_capacity_names_what_the_cluster_has(nnodes, per_node, use_gpu, resources, cores, expected):
    problem = cluster_capacity_problem(nnodes, per_node, use_gpu, resources, 1, cores)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and "\n" not in problem
    assert MAX_CPU_RANKS_PER_CORE >= 2


def test_split_engines_count_their_own_ranks_and_name_both_keys():
    # 4 training + 4 rollout GPUs on a 4-GPU node: refused, naming both groups' keys
    problem = cluster_capacity_problem(1, 4, True, {"CPU": 16.0, "GPU": 4.0}, 1, 16, rollout_shape=(1, 4))
    assert problem == (
        "trainer.nnodes x trainer.n_gpus_per_node = 1 x 4 = 4 ranks + actor_rollout_ref.rollout.nnodes x "
        "actor_rollout_ref.rollout.n_gpus_per_node = 1 x 4 rollout ranks = 8 ranks need 8 GPUs, but the "
        "Ray cluster has 4 GPU(s) and 16 CPU(s) on 1 node(s); lower trainer.n_gpus_per_node / "
        "trainer.nnodes or actor_rollout_ref.rollout.n_gpus_per_node / actor_rollout_ref.rollout.nnodes"
    )
    assert cluster_capacity_problem(1, 4, True, {"CPU": 16.0, "GPU": 8.0}, 1, 16, rollout_shape=(1, 4)) is None
    assert cluster_capacity_problem(1, 1, False, {"CPU": 2.0}, 1, 2, rollout_shape=(1, 1)) is None  # 1 + 1 CPU ranks


def _trainer(*args, cwd):
    import os
    import subprocess
    import sys

    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    return subprocess.run(
        [sys.executable, "-m", "luffy_pool.main_mix_ppo", "--config-name", "tiny_cpu_luffy", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ),
    )


@pytest.mark.slow  # two trainer subprocesses (~8 s CPU each: torch, transformers, the tokenizer); no Ray
@pytest.mark.parametrize("case", ["bad_row", "context"])
def test_data_and_context_problems_exit_2_with_one_line_before_ray(case, tiny_model_dir, tiny_task_dir, tmp_path):
    import pandas as pd

    train = f"{tiny_task_dir}/train.parquet"
    overrides = []
    if case == "bad_row":
        frame = pd.read_parquet(train)
        frame.at[3, "reward_model"] = {"ground_truth": "nan", "style": "rule"}
        train = str(tmp_path / "bad.parquet")
        frame.to_parquet(train)
        expected = f"Config error: {train}: row 3: column 'reward_model': ground_truth 'nan' is NaN/infinite"
    else:
        overrides = ["data.max_response_length=100000", f"{A}.use_dynamic_bsz=False"]
        expected = "Config error: data.max_prompt_length (128) + data.max_response_length (100000) = 100128 exceeds"
    proc = _trainer(
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        "data.val_files=null",
        f"trainer.default_local_dir={tmp_path / 'out'}",
        f"hydra.run.dir={tmp_path}",
        *overrides,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Config error: ")]
    assert len(errors) == 1 and errors[0].startswith(expected), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_resolved_config_goes_to_a_file_not_the_console(compose_config, tmp_path):
    import yaml

    from luffy_pool.run.main_mix_ppo import write_resolved_config

    cfg = compose_config(PATHS + [f"trainer.default_local_dir={tmp_path / 'run'}"], "tiny_cpu_luffy")
    path = write_resolved_config(cfg)
    assert path == str(tmp_path / "run" / "resolved_config.yaml")
    assert yaml.safe_load(open(path))["trainer"]["default_local_dir"] == str(tmp_path / "run")
    blocked = tmp_path / "file"
    blocked.write_text("x")
    cfg = compose_config(PATHS + [f"trainer.default_local_dir={blocked}/run"], "tiny_cpu_luffy")
    assert write_resolved_config(cfg) is None  # pre-flight names the folder; the run prints the YAML instead
