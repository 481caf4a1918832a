"""A CPU engine inspects its model class in its own process (cpu_model_inspect.py), with vLLM's real registry."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")


def test_inspection_runs_in_this_process_and_gives_vllms_answer(monkeypatch):
    from vllm.model_executor.models import registry

    from luffy_pool_dev.cpu_model_inspect import inspect_models_in_process

    monkeypatch.setattr(registry, "_run_in_subprocess", registry._run_in_subprocess)  # undone after the test
    assert inspect_models_in_process() is True

    started = registry.subprocess.run

    def no_interpreter(cmd, *args, **kwargs):
        assert "vllm.model_executor.models.registry" not in cmd, f"an inspection interpreter was started: {cmd}"
        return started(cmd, *args, **kwargs)

    monkeypatch.setattr(registry.subprocess, "run", no_interpreter)
    lazy = registry.ModelRegistry.models["Qwen2ForCausalLM"]
    monkeypatch.setattr(type(lazy), "_load_modelinfo_from_cache", lambda self, module_hash: None)  # a cold cache
    saved = []
    monkeypatch.setattr(type(lazy), "_save_modelinfo_to_cache", lambda self, mi, module_hash: saved.append(mi))
    info = lazy.inspect_model_cls()
    assert info == registry._ModelInfo.from_model_cls(lazy.load_model_cls())
    assert info.is_text_generation_model and saved == [info]  # cached as vLLM caches the subprocess's answer
