"""LUFFY rollout keys -> vllm.LLM arguments, on CPU and GPU, without starting an engine."""

import pytest

from luffy_pool.config.compose import rollout_section
from verl.workers.rollout.vllm_rollout.config import build_engine_kwargs, engine_config

EXT = "pkg.mod.Ext"


def parse(**values):
    """The engine config of the YAML's rollout section with ``values`` set."""
    return engine_config(rollout_section(**values))


def test_defaults_are_the_yamls_rollout_defaults():
    cfg = parse()
    assert (cfg.temperature, cfg.top_p, cfg.top_k) == (1.0, 1.0, -1)
    assert (cfg.gpu_memory_utilization, cfg.max_num_batched_tokens, cfg.max_num_seqs) == (0.5, 8192, 1024)
    assert not cfg.enforce_eager and cfg.free_cache_engine  # CUDA graphs on cuda; CPU engines always run eager
    assert cfg.engine_max_model_len == 512 + 512


def test_the_engines_spelling_of_dtype_and_load_format():
    cfg = parse(temperature=0.6, prompt_length=100, response_length=28, load_format="dummy_dtensor", dtype="bf16")
    assert cfg.temperature == 0.6
    assert cfg.engine_max_model_len == 128
    assert cfg.load_format == "dummy"  # LUFFY's weight-source spelling maps to vLLM's random init
    assert cfg.dtype == "bfloat16"
    with pytest.raises(TypeError, match="typed actor_rollout_ref.rollout section"):
        engine_config({"temperature": 0.6})  # a partial dict would take defaults from somewhere else


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("top_p", 0.0, "rollout.top_p"),
        ("top_k", -2, "rollout.top_k"),
        ("temperature", -0.1, "rollout.temperature"),
        ("temperature", 0.0, "rollout.temperature"),  # > 0, as declared (do_sample=False is greedy)
        ("dtype", "int8", "rollout.dtype"),
        ("load_format", "pickle", "rollout.load_format"),
        ("enforce_eager", "yes", "rollout.enforce_eager"),
        ("max_num_seqs", 2.5, "rollout.max_num_seqs"),
        ("sleep_level", 3, "rollout.sleep_level"),
        ("logprobs_mode", "raw_logits", "rollout.logprobs_mode"),
    ],
)
def test_bad_values_name_the_key(key, value, message):
    """The declarations refuse them (the checker, before a run; ``rollout_section``, for an engine on its own)."""
    with pytest.raises(ValueError, match=message):
        rollout_section(**{key: value})


def test_cpu_engine_is_fp32_eager_with_explicit_kv_cache_and_no_sleep_mode():
    cfg = parse(
        prompt_length=64, response_length=64, cpu_kv_cache_bytes=1 << 20, dtype="auto", tensor_model_parallel_size=1
    )
    kw = build_engine_kwargs(cfg, "/m", "cpu", world_size=1, extension_cls=EXT)
    assert kw["dtype"] == "float32"
    assert kw["kv_cache_memory_bytes"] == 1 << 20
    assert kw["enforce_eager"] is True  # the YAML's False is for cuda
    assert kw["max_model_len"] == 128
    assert kw["worker_extension_cls"] == EXT
    assert "enable_sleep_mode" not in kw and "gpu_memory_utilization" not in kw
    assert "distributed_executor_backend" not in kw


def test_cpu_honours_an_explicit_dtype_and_shards_tensor_parallel_inside_a_group():
    kw = build_engine_kwargs(parse(dtype="bfloat16", tensor_model_parallel_size=1), "/m", "cpu", 1, EXT)
    assert kw["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2 must divide the worker group size 1"):
        build_engine_kwargs(parse(tensor_model_parallel_size=2), "/m", "cpu", 1, EXT)
    # inside a worker group vLLM-CPU shards over the TP group's ranks (external launcher over gloo)
    kw = build_engine_kwargs(parse(tensor_model_parallel_size=2), "/m", "cpu", 4, EXT)
    assert kw["tensor_parallel_size"] == 2 and kw["distributed_executor_backend"] == "external_launcher"


def test_gpu_engine_uses_tp_sleep_mode_and_external_launcher_inside_a_worker_group():
    cfg = parse(tensor_model_parallel_size=2, gpu_memory_utilization=0.8, free_cache_engine=True, dtype="bfloat16")
    kw = build_engine_kwargs(cfg, "/m", "cuda", world_size=8, extension_cls=EXT)
    assert kw["tensor_parallel_size"] == 2
    assert kw["gpu_memory_utilization"] == 0.8
    assert kw["enable_sleep_mode"] is True
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["disable_custom_all_reduce"] is True  # A8: the colocated engine
    assert kw["enforce_eager"] is False  # the YAML's default: CUDA graphs
    assert "kv_cache_memory_bytes" not in kw
    single = build_engine_kwargs(parse(free_cache_engine=False, tensor_model_parallel_size=1), "/m", "cuda", 1, EXT)
    assert single["enable_sleep_mode"] is False and "distributed_executor_backend" not in single


def test_tp_must_divide_the_worker_group():
    with pytest.raises(ValueError, match="must divide the worker group size 6"):
        build_engine_kwargs(parse(tensor_model_parallel_size=4), "/m", "cuda", 6, EXT)


def test_disabled_chunked_prefill_gets_a_batch_that_fits_a_whole_prompt():
    cfg = parse(
        enable_chunked_prefill=False,
        max_num_batched_tokens=1024,
        prompt_length=2048,
        response_length=2048,
        tensor_model_parallel_size=1,
    )
    assert build_engine_kwargs(cfg, "/m", "cuda", 1, EXT)["max_num_batched_tokens"] == 4096


def test_gpu_sleep_then_staged_wake_up_weights_before_kv_cache(engine_recorder, tiny_model_dir):
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    engine = engine_recorder()
    rollout = VLLMRollout(
        tiny_model_dir, rollout_section(sleep_level=2, tensor_model_parallel_size=1), device="cuda", engine=engine
    )
    rollout.wake_up()  # awake already: nothing to do
    rollout.sleep()
    rollout.sleep()
    rollout.wake_up_weights()
    rollout.wake_up()
    rollout.sleep()
    rollout.wake_up()  # no staged weight wake-up: everything at once
    assert engine.calls == [
        ("sleep", 2),
        ("wake_up", ["weights"]),
        ("wake_up", ["kv_cache"]),
        ("sleep", 2),
        ("wake_up", None),
    ]


def test_sleep_is_a_noop_on_cpu_and_without_free_cache_engine(engine_recorder, tiny_model_dir):
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    for device, values in (("cpu", {}), ("cuda", {"free_cache_engine": False})):
        engine = engine_recorder()
        rollout = VLLMRollout(
            tiny_model_dir, rollout_section(tensor_model_parallel_size=1, **values), device=device, engine=engine
        )
        rollout.sleep()
        rollout.wake_up_weights()
        rollout.wake_up()
        assert engine.calls == []


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_reload_api_check_passes_on_the_pinned_vllm_and_names_a_missing_api(monkeypatch):
    """The weight sync's reload API is checked before an engine is built."""
    from vllm.v1.worker.gpu_worker import Worker

    from verl.workers.rollout.vllm_rollout.compat import check_reload_api, missing_reload_api

    assert missing_reload_api() is None  # vLLM 0.32.0 (requirements.txt) has it
    check_reload_api()
    monkeypatch.delattr(Worker, "reload_weights")
    with pytest.raises(
        RuntimeError,
        match=r"installed vLLM \(.+\) cannot receive trainer weights: .*Worker has no "
        r"reload_weights; the weight sync needs Worker.reload_weights",
    ):
        check_reload_api()


def test_remove_run_cpu_shm_only_touches_that_run(tmp_path):
    from verl.workers.rollout.vllm_rollout.vllm_rollout import remove_run_cpu_shm

    for name in (
        "luffy4242-tp:0-[0-1]-cpushm_0",
        "luffy4242-tp:0-[2-3]-cpushm_1",
        "luffy4243-tp:0-[0-1]-cpushm_0",
        "psm_other",
    ):
        (tmp_path / name).write_bytes(b"x")
    removed = remove_run_cpu_shm(4242, shm_dir=str(tmp_path))
    assert len(removed) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["luffy4243-tp:0-[0-1]-cpushm_0", "psm_other"]


def test_the_engine_config_is_the_section_and_restates_no_key(compose_config):
    """The engine config holds the worker's section and nothing else (no key, type, default or bound of its own):
    every rollout key reads the YAML's value through it, dtype and load_format in the engines' spelling."""
    import dataclasses

    from luffy_pool.config.check import schema_defaults
    from verl.workers.config_sections import RolloutSection
    from verl.workers.rollout.config import RolloutEngineConfig

    assert [f.name for f in dataclasses.fields(RolloutEngineConfig)] == ["section"]
    rollout = compose_config([]).actor_rollout_ref.rollout
    cfg = engine_config(RolloutSection.from_rollout_config(rollout))
    yaml = {k.rsplit(".", 1)[1]: v for k, v in schema_defaults().items() if k.startswith("actor_rollout_ref.rollout.")}
    canonical = {"dtype": {"bfloat16": "bfloat16"}, "load_format": {"dummy_dtensor": "dummy"}}
    for f in dataclasses.fields(RolloutSection):
        want = canonical.get(f.name, {}).get(yaml[f.name], yaml[f.name])
        if f.name not in (
            "prompt_length",
            "response_length",
            "log_prob_use_dynamic_bsz",
            "log_prob_max_token_len_per_gpu",
        ):  # interpolated in the YAML
            assert getattr(cfg, f.name) == want, f.name
    assert cfg.tensor_model_parallel_size == 2


def _vllm_envs_module():
    """vllm/envs.py of the installed vLLM, loaded on its own (it imports only the standard library)."""
    import importlib.util
    import os

    location = importlib.util.find_spec("vllm").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("_luffy_vllm_envs", os.path.join(location, "envs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cuda_engine_env_turns_off_the_all_reduce_paths_custom_all_reduce_leaves_on(monkeypatch):
    from verl.workers.rollout.vllm_rollout.config import engine_env

    assert engine_env("cpu") == {}
    env = engine_env("cuda")
    assert env == {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"}
    envs = _vllm_envs_module()
    for name, value in env.items():  # vLLM 0.32 reads these names; on by default, off with our value
        monkeypatch.delenv(name, raising=False)
        assert envs.environment_variables[name]() is True
        monkeypatch.setenv(name, value)
        assert envs.environment_variables[name]() is False


def test_a_cuda_rollout_sets_the_engine_env_before_its_engine_and_overrides_the_users(
    monkeypatch, engine_recorder, tiny_model_dir
):
    import os

    from verl.workers.rollout.vllm_rollout import VLLMRollout
    from verl.workers.rollout.vllm_rollout.vllm_rollout import apply_engine_env

    # a user's exports (restored after the test): neither can work on a rank that sees one GPU
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "1")
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_FLASHINFER", "1")
    VLLMRollout(tiny_model_dir, rollout_section(tensor_model_parallel_size=1), device="cuda", engine=engine_recorder())
    assert os.environ["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0" and os.environ["VLLM_ALLREDUCE_USE_FLASHINFER"] == "0"
    environ = {}
    assert apply_engine_env("cpu", environ) == {} and environ == {}  # the CPU engine has neither path
