"""The hybrid engine between steps (docs/DESIGN.md §2 item 9), on CPU: vLLM sleeps at level 2 (weights dropped, not
copied to host and back), the process-group timeout is a checked config key used by init_process_group,
and the reload-API check covers vLLM 0.32's Model Runner V2 as well as V1."""

from __future__ import annotations

import datetime
import inspect

import pytest

ARR = "actor_rollout_ref"


def test_the_default_rollout_group_sleeps_at_level_2_and_wakes_weights_before_the_push(
    engine_recorder, compose_config, tiny_model_dir
):
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    rollout_cfg = compose_config([f"{ARR}.rollout.tensor_model_parallel_size=1"]).actor_rollout_ref.rollout
    assert rollout_cfg.sleep_level == 2 and rollout_cfg.free_cache_engine
    engine = engine_recorder()
    from verl.workers.config_sections import RolloutSection

    rollout = VLLMRollout(tiny_model_dir, RolloutSection.from_rollout_config(rollout_cfg), device="cuda", engine=engine)
    rollout.sleep()
    rollout.wake_up_weights()  # the sharding manager's sync: weights back (empty at level 2), then the push
    rollout.wake_up()
    assert engine.calls == [("sleep", 2), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]


def test_level_2_is_safe_because_the_sync_refuses_a_push_that_misses_a_tensor(engine_recorder, tiny_model_dir):
    """Level 2 leaves the woken weights undefined: only a sync that overwrites every checkpoint tensor may
    follow it, and after_weight_update checks exactly that against the checkpoint's tensor names."""
    import torch

    from verl.workers.rollout.vllm_rollout import VLLMRollout

    class Engine(engine_recorder):
        def reset_prefix_cache(self):
            pass

        def __init__(self):
            super().__init__()
            self.rpcs = []

        def collective_rpc(self, method, *args, **kwargs):
            self.rpcs.append(method)
            return [0]

    from luffy_pool.config.compose import rollout_section

    engine = Engine()
    rollout = VLLMRollout(tiny_model_dir, rollout_section(tensor_model_parallel_size=1), device="cuda", engine=engine)
    rollout.update_weights([("model.norm.weight", torch.ones(4))])
    with pytest.raises(RuntimeError, match="weight sync incomplete: .* checkpoint tensors were not pushed"):
        rollout.after_weight_update()
    assert engine.rpcs == ["begin_weight_push", "load_weight_bucket", "finish_weight_push"]  # one engine reload


def test_a_bucketed_push_opens_and_closes_one_engine_reload(engine_recorder, tiny_model_dir):
    """Three buckets, the middle one splitting a decoder layer: one begin, one finish, and each load holds whole
    layers (the split layer waits for its rest)."""
    import torch

    from luffy_pool.config.compose import rollout_section
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    class Engine(engine_recorder):
        def __init__(self):
            super().__init__()
            self.rpcs = []

        def reset_prefix_cache(self):
            pass

        def collective_rpc(self, method, args=()):
            self.rpcs.append((method, [name for name, _ in args[0]] if args else None))
            return [0]

    engine = Engine()
    rollout = VLLMRollout(tiny_model_dir, rollout_section(tensor_model_parallel_size=1), device="cuda", engine=engine)
    rollout._expected_names = None  # a partial model: only the reload calls are checked here
    t = torch.zeros(2)
    rollout.update_weights([("model.embed_tokens.weight", t), ("model.layers.0.q.weight", t)])
    rollout.update_weights([("model.layers.0.k.weight", t), ("model.layers.1.q.weight", t)])
    rollout.update_weights([("model.layers.1.k.weight", t), ("model.norm.weight", t)])
    rollout.after_weight_update()
    assert engine.rpcs == [
        ("begin_weight_push", None),
        ("load_weight_bucket", ["model.embed_tokens.weight"]),
        ("load_weight_bucket", ["model.layers.0.q.weight", "model.layers.0.k.weight"]),
        ("load_weight_bucket", ["model.layers.1.q.weight", "model.layers.1.k.weight"]),
        ("load_weight_bucket", ["model.norm.weight"]),
        ("finish_weight_push", None),
    ]
    assert rollout.weights_version == 1


@pytest.mark.parametrize(
    "key,value,needle",
    [
        (f"{ARR}.rollout.sleep_level", 3, "sleep_level"),
        (f"{ARR}.nccl_timeout", 0, "nccl_timeout"),
    ],
)
def test_bad_values_are_refused_by_the_config_check(compose_config, key, value, needle):
    from luffy_pool.config.check import ConfigError, check_config

    cfg = compose_config(
        [f"{key}={value}", "data.train_files=a.parquet", "data.val_files=b.parquet", f"{ARR}.model.path=/m"]
    )
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert any(needle in line for line in err.value.errors), err.value.errors


def test_the_worker_passes_the_configured_timeout_to_init_process_group(compose_config, monkeypatch):
    from types import SimpleNamespace

    from verl.workers import fsdp_workers
    from verl.workers.config_sections import WorkerSections

    sections = WorkerSections.from_config(compose_config([f"{ARR}.nccl_timeout=2700"]).actor_rollout_ref)
    assert sections.nccl_timeout == 2700
    seen = {}

    class Joined(Exception):
        pass

    def fake_init(**kwargs):
        seen.update(kwargs)
        raise Joined

    monkeypatch.setattr(fsdp_workers.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(fsdp_workers.dist, "init_process_group", fake_init)
    worker = SimpleNamespace(sections=sections, device="cuda", rank=0, world_size=8)
    with pytest.raises(Joined):
        fsdp_workers.ActorRolloutRefWorker._init_distributed(worker)
    assert seen["backend"] == "nccl" and seen["timeout"] == datetime.timedelta(seconds=2700)


# ------------------------------------------------------------------------------ reload API, V1 and V2
def test_the_installed_vllm_has_the_reload_api_in_both_model_runners():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    from verl.workers.rollout.vllm_rollout.compat import MODEL_RUNNERS, missing_reload_api

    assert [m for _, m, _ in MODEL_RUNNERS] == [V1.__module__, V2.__module__]
    for runner in (V1, V2):
        assert "weights_iterator" in inspect.signature(runner.reload_weights).parameters
    assert missing_reload_api() is None


@pytest.mark.parametrize(
    "label,module", [("V1", "vllm.v1.worker.gpu_model_runner"), ("V2", "vllm.v1.worker.gpu.model_runner")]
)
def test_a_model_runner_without_the_reload_api_is_named(monkeypatch, label, module):
    import importlib

    from verl.workers.rollout.vllm_rollout.compat import check_reload_api

    runner = importlib.import_module(module).GPUModelRunner

    def old_reload(self, weights_path=None):  # an older signature: no weights_iterator
        pass

    monkeypatch.setattr(runner, "reload_weights", old_reload)
    with pytest.raises(
        RuntimeError,
        match=rf"cannot receive trainer weights: its model runner {label} \({module}"
        rf"\.GPUModelRunner\) has no reload_weights\(weights_iterator=\.\.\.\)",
    ):
        check_reload_api()


def test_an_unimportable_v2_runner_is_not_a_reload_problem_but_v1_is(monkeypatch):
    import importlib

    from verl.workers.rollout.vllm_rollout import compat

    real = importlib.import_module

    def broken(target):
        def fake(name, *args, **kwargs):
            if name == target:
                raise ImportError(f"no module {name}")
            return real(name, *args, **kwargs)

        return fake

    monkeypatch.setattr(compat.importlib, "import_module", broken("vllm.v1.worker.gpu.model_runner"))
    assert compat.missing_reload_api() is None
    monkeypatch.setattr(compat.importlib, "import_module", broken("vllm.v1.worker.gpu_model_runner"))
    assert "V1 model runner (vllm.v1.worker.gpu_model_runner) cannot be imported" in compat.missing_reload_api()


def test_a_vllm_without_the_layerwise_steps_of_one_reload_per_push_is_named(monkeypatch):
    import importlib

    from verl.workers.rollout.vllm_rollout.compat import check_reload_api

    reload_module = importlib.import_module("vllm.model_executor.model_loader.reload")
    monkeypatch.delattr(reload_module, "finalize_layerwise_reload")
    with pytest.raises(
        RuntimeError,
        match=r"cannot receive trainer weights: vllm\.model_executor\.model_loader"
        r"\.reload has no finalize_layerwise_reload",
    ):
        check_reload_api()
    monkeypatch.undo()
    runner = importlib.import_module("vllm.v1.worker.gpu.model_runner").GPUModelRunner
    monkeypatch.delattr(runner, "reset_mm_cache")
    with pytest.raises(
        RuntimeError,
        match=r"its model runner V2 \(vllm\.v1\.worker\.gpu\.model_runner"
        r"\.GPUModelRunner\) has no reset_mm_cache",
    ):
        check_reload_api()
