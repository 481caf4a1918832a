"""luffy_pool/run/launcher.py without Ray: device and CPU-binding choice, and that every exit path of
build_trainer / close releases what it built (the off-policy pool once replaced the Ray pool, so close() leaked the placement groups)."""

import types

import pytest

from luffy_pool.run import launcher
from luffy_pool.config.sections import ConfigSections

S = ConfigSections.from_config  # the launcher's helpers take the run's sections


class FakeGroup:
    world_size = 2

    def __init__(self):
        self.shut = False

    def shutdown(self):
        self.shut = True


class FakeRayPool:
    def __init__(self):
        self.released = False

    def release(self):
        self.released = True


class FakeReward:
    closed = False

    def close(self):
        FakeReward.closed = True


class FakeTracker:
    finished = False

    def __init__(self, *args, **kwargs):
        pass

    def finish(self):
        FakeTracker.finished = True


def _cfg(compose_config, task_dir, model_dir, tmp_path, *extra):
    return compose_config(
        [
            f"data.train_files={task_dir}/train.parquet",
            f"data.val_files={task_dir}/test.parquet",
            f"actor_rollout_ref.model.path={model_dir}",
            "data.train_batch_size=4",
            "data.max_prompt_length=96",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=2",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={tmp_path}",
            *extra,
        ]
    )


@pytest.fixture
def fakes(monkeypatch):
    """build_trainer's collaborators that need Ray or processes, replaced by recorders."""
    built = types.SimpleNamespace(group=FakeGroup(), pool=FakeRayPool())
    FakeReward.closed = FakeTracker.finished = False
    monkeypatch.setattr(launcher, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 2.0})  # a CPU-only cluster
    monkeypatch.setattr(
        launcher, "build_worker_group", lambda config, sections, device, total: (built.group, built.pool)
    )
    monkeypatch.setattr("verl.workers.reward_manager.RewardManager.from_config", lambda *a, **k: FakeReward())
    monkeypatch.setattr("verl.utils.tracking.Tracking", FakeTracker)
    return built


def test_driver_device_and_cpu_binding(compose_config, tiny_task_dir, tiny_model_dir, tmp_path, monkeypatch):
    cfg = _cfg(compose_config, tiny_task_dir, tiny_model_dir, tmp_path)
    gpus = {"CPU": 8.0}
    monkeypatch.setattr(
        "ray.cluster_resources", lambda: gpus
    )  # the joined cluster's resources (docs/DESIGN.md §2 item 1)
    assert launcher.resolve_driver_device(S(cfg)) == "cpu"
    cfg.trainer.device = "auto"
    assert launcher.resolve_driver_device(S(cfg)) == "cpu"
    gpus["GPU"] = 2.0
    assert launcher.resolve_driver_device(S(cfg)) == "cuda"
    cfg.trainer.device = "cuda"
    assert launcher.resolve_driver_device(S(cfg)) == "cuda"
    cfg.actor_rollout_ref.rollout.name = "hf"
    assert launcher.resolve_cpu_bind(S(cfg), "cpu") == "auto" and launcher.resolve_cpu_bind(S(cfg), "cuda") == "none"
    cfg.actor_rollout_ref.rollout.name = "vllm"  # vLLM's CPU backend binds its own threads
    assert launcher.resolve_cpu_bind(S(cfg), "cpu") == "none"
    cfg.trainer.cpu_bind = "always"  # a bad mode is the checker's to refuse, before the launcher runs
    from luffy_pool.config.check import validate_config

    assert any("trainer.cpu_bind" in e and "'always'" in e for e in validate_config(cfg))


def test_release_worker_group_frees_workers_and_placement_groups():
    group, pool = FakeGroup(), FakeRayPool()
    launcher.release_worker_group(group, pool)
    assert group.shut and pool.released
    launcher.release_worker_group(None, None)  # nothing built yet: nothing to do


def test_close_releases_the_ray_pool_even_with_an_off_policy_pool(
    fakes, compose_config, tiny_task_dir, tiny_model_dir, tmp_path, monkeypatch
):
    off_policy = types.SimpleNamespace(has_extra_traces=True)  # no release(): close() once called it on this object
    monkeypatch.setattr(launcher, "build_off_policy_pool", lambda *a, **k: off_policy)
    trainer, close = launcher.build_trainer(_cfg(compose_config, tiny_task_dir, tiny_model_dir, tmp_path))
    assert trainer.off_policy_pool is off_policy and trainer.wg is fakes.group
    close()
    assert fakes.pool.released and fakes.group.shut and FakeReward.closed and FakeTracker.finished


def test_a_failure_while_building_releases_everything_and_raises_the_original_error(
    fakes, compose_config, tiny_task_dir, tiny_model_dir, tmp_path, monkeypatch
):
    def broken(*args, **kwargs):
        raise RuntimeError("trainer construction failed")

    monkeypatch.setattr("luffy_pool.trainer.mix_trainer.MIXRayPPOTrainer", broken)
    with pytest.raises(RuntimeError, match="trainer construction failed"):
        launcher.build_trainer(_cfg(compose_config, tiny_task_dir, tiny_model_dir, tmp_path))
    assert fakes.pool.released and fakes.group.shut and FakeReward.closed


def test_too_few_rows_for_one_batch_names_the_key(compose_config, tiny_task_dir, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    cfg = _cfg(compose_config, tiny_task_dir, tiny_model_dir, tmp_path, "data.train_batch_size=1000")
    with pytest.raises(ValueError, match="fewer than data.train_batch_size=1000"):
        launcher.build_dataloader(S(cfg), AutoTokenizer.from_pretrained(tiny_model_dir))


def test_sample_target_ratio_redraws_per_epoch_of_the_resumable_sampler(
    compose_config, tiny_task_dir, tiny_model_dir, tmp_path
):
    from transformers import AutoTokenizer

    cfg = _cfg(compose_config, tiny_task_dir, tiny_model_dir, tmp_path, "data.sample_target_ratio=0.5")
    loader, _, _, _ = launcher.build_dataloader(S(cfg), AutoTokenizer.from_pretrained(tiny_model_dir))
    assert loader.dataset.sample_target_mode == "redraw" and loader.dataset._epoch_source is loader.sampler


def test_use_off_policy_probs_without_any_behaviour_probabilities_is_refused(
    fakes, compose_config, tiny_task_dir, tiny_model_dir, tmp_path
):
    cfg = _cfg(
        compose_config,
        tiny_task_dir,
        tiny_model_dir,
        tmp_path,
        "actor_rollout_ref.actor.use_off_policy_loss=True",
        "actor_rollout_ref.actor.use_off_policy_probs=True",
    )
    with pytest.raises(ValueError, match="no 'target_ds_qwen_7b_probs' column and data.off_policy_files give no"):
        launcher.build_trainer(cfg)
    assert not fakes.pool.released and not fakes.group.shut  # refused with the data, before Ray and any worker


def test_a_bad_data_row_is_an_input_error_before_ray(
    fakes, compose_config, tiny_task_dir, tiny_model_dir, tmp_path, monkeypatch
):
    import pandas as pd

    from luffy_pool.run.preflight import InputError

    frame = pd.read_parquet(f"{tiny_task_dir}/train.parquet")
    frame.at[1, "reward_model"] = {"ground_truth": " ", "style": "rule"}
    bad = str(tmp_path / "bad.parquet")
    frame.to_parquet(bad)
    started = []
    monkeypatch.setattr(launcher, "init_ray", lambda *a, **k: started.append(1))
    with pytest.raises(InputError) as info:
        launcher.build_trainer(_cfg(compose_config, tiny_task_dir, tiny_model_dir, tmp_path, f"data.train_files={bad}"))
    assert info.value.errors == [f"{bad}: row 1: column 'reward_model': ground_truth is empty"] and not started


def test_more_ranks_than_the_cluster_holds_are_refused_naming_what_it_has(
    fakes, compose_config, tiny_task_dir, tiny_model_dir, tmp_path
):
    from luffy_pool.run.preflight import PreflightError

    cfg = _cfg(
        compose_config, tiny_task_dir, tiny_model_dir, tmp_path, "trainer.n_gpus_per_node=4", "ray_init.address=auto"
    )  # joined cluster: its 2 CPUs are real
    with pytest.raises(
        PreflightError, match=r"= 4 ranks need 4 CPU bundles, but the Ray cluster has 0 GPU\(s\) and 2 CPU"
    ):
        launcher.build_trainer(cfg)
    assert not fakes.group.shut  # no worker was started


def test_a_gpu_run_over_its_memory_plan_stops_before_any_worker_loads_the_model(
    fakes, compose_config, tiny_task_dir, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    # the plan of the device's real memory (torch.cuda.mem_get_info, here monkeypatched) is printed
    # once; trainer.memory_plan=error refuses a plan over it, naming the phase and the key to change.
    import luffy_pool.memory_plan as memory_plan

    built = []
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 2.0, "GPU": 2.0})  # a GPU cluster
    monkeypatch.setattr(launcher, "resolve_driver_device", lambda sections: "cuda")
    monkeypatch.setattr(
        launcher,
        "build_worker_group",
        lambda config, sections, device, total: built.append(device) or (fakes.group, fakes.pool),
    )
    monkeypatch.setattr(memory_plan, "device_memory_bytes", lambda: 2**30)  # a 1 GiB "GPU"
    cfg = _cfg(compose_config, tiny_task_dir, tiny_model_dir, tmp_path, "trainer.memory_plan=error")
    with pytest.raises(
        memory_plan.MemoryPlanError, match=r"phase 'rollout \(vLLM awake\)' needs .* the device has 1.0 GiB"
    ):
        launcher.build_trainer(cfg)
    assert built == [] and capsys.readouterr().out.count("memory plan (luffy_pool.memory_plan") == 1
    monkeypatch.setattr(memory_plan, "device_memory_bytes", lambda: 80 * 2**30)  # fits: goes on to the workers
    _, close = launcher.build_trainer(cfg)
    close()
    assert built == ["cuda"]


def test_the_workers_arguments_cross_to_ray_processes(compose_config):
    """The worker gets the typed sections (frozen dataclasses), the step count and the loss's knob values, not the
    raw config: all of them survive Ray's serialisation unchanged, and a raw config group is refused."""
    import cloudpickle

    from luffy_pool.workers.mix_fsdp_worker import MIXActorRolloutRefWorker
    from verl.workers.rollout.config import engine_config

    config = compose_config(["data.train_files=x", "data.val_files=null", "actor_rollout_ref.model.path=m"])
    sections = S(config)
    workers = cloudpickle.loads(cloudpickle.dumps(sections.workers))
    assert workers == sections.workers and workers.actor.clip_ratio == config.actor_rollout_ref.actor.clip_ratio
    engine = engine_config(sections.workers.rollout)
    assert cloudpickle.loads(cloudpickle.dumps(engine)) == engine
    assert launcher.policy_loss_knobs(config, sections) is None  # luffy_token reads the actor's loss section
    with pytest.raises(TypeError, match="takes the typed actor_rollout_ref sections"):
        MIXActorRolloutRefWorker(config.actor_rollout_ref, role="actor", device="cpu")


def test_a_registered_losss_knobs_are_built_once_for_the_workers(compose_config):
    from dataclasses import dataclass

    from verl.trainer.ppo.core_algos import POLICY_LOSS_CONFIGS, POLICY_LOSS_REGISTRY, register_policy_loss

    @dataclass(frozen=True)
    class Knobs:
        clip_ratio: float
        a2_scale: float = 1.0

    name = "a2_test_knob_loss"
    register_policy_loss(name, config=Knobs)(lambda inputs, cfg: None)
    try:
        A = "actor_rollout_ref.actor"
        config = compose_config(
            [
                "data.train_files=x",
                "data.val_files=null",
                "actor_rollout_ref.model.path=m",
                f"{A}.policy_loss={name}",
                f"+{A}.a2_scale=0.25",
                f"{A}.clip_ratio=0.3",
            ]
        )
        assert launcher.policy_loss_knobs(config, S(config)) == {"clip_ratio": 0.3, "a2_scale": 0.25}
    finally:
        POLICY_LOSS_REGISTRY.pop(name)
        POLICY_LOSS_CONFIGS.pop(name)
