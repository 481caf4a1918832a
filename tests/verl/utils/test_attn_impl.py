"""Attention kernel choice without flash-attn (docs/DESIGN.md §2 item 10): ``auto`` falls back to sdpa with one warning naming
the package; an explicit flash-attention kernel without its package fails at pre-flight in one line."""

from __future__ import annotations

import logging

import pytest

from verl.utils import attn_impl


@pytest.fixture
def no_flash(monkeypatch):
    """This interpreter as a GPU image without flash-attn / flash-attn-3 (whatever is really installed)."""
    real = attn_impl.package_importable
    monkeypatch.setattr(
        attn_impl,
        "package_importable",
        lambda module: False if module in ("flash_attn", "flash_attn_interface") else real(module),
    )
    monkeypatch.setattr(attn_impl, "_warned", False)


def test_auto_on_cuda_without_flash_attn_falls_back_to_sdpa_with_one_warning(no_flash, caplog):
    with caplog.at_level(logging.WARNING, logger=attn_impl.__name__):
        picks = [attn_impl.resolve_attn_implementation("auto", "cuda") for _ in range(3)]  # actor, ref, ...
    assert picks == ["sdpa"] * 3
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "flash-attn" in warnings[0] and "actor_rollout_ref.model.attn_implementation=auto" in warnings[0]


def test_auto_picks_flash_attention_on_cuda_when_the_package_imports(monkeypatch, caplog):
    monkeypatch.setattr(attn_impl, "package_importable", lambda module: module == "flash_attn")
    with caplog.at_level(logging.WARNING, logger=attn_impl.__name__):
        assert attn_impl.resolve_attn_implementation("auto", "cuda") == "flash_attention_2"
    assert caplog.records == []


def test_auto_is_sdpa_on_cpu_silently_and_explicit_names_pass_through(no_flash, caplog):
    with caplog.at_level(logging.WARNING, logger=attn_impl.__name__):
        assert attn_impl.resolve_attn_implementation("auto", "cpu") == "sdpa"
        assert attn_impl.resolve_attn_implementation("eager", "cuda") == "eager"
        assert attn_impl.resolve_attn_implementation("flash_attention_2", "cuda") == "flash_attention_2"
    assert caplog.records == []


def test_the_sft_trainer_resolves_through_the_same_rule(no_flash, caplog):
    from verl.trainer.sft.fsdp_model import resolve_attn_implementation

    with caplog.at_level(logging.WARNING, logger=attn_impl.__name__):
        assert resolve_attn_implementation("auto", "cuda") == "sdpa"
    assert "model.attn_implementation=auto" in caplog.records[0].getMessage()


def test_the_worker_builds_its_model_with_the_resolved_kernel(no_flash, monkeypatch, tiny_model_dir):
    """A cuda worker with attn_implementation=auto and no flash-attn builds an sdpa model (it used to pick
    flash_attention_2 and fail in from_config on every rank)."""
    from types import SimpleNamespace

    from verl.utils import meta_init
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    class Built(Exception):
        pass

    def empty_model(hf_config, dtype, attn, trust_remote_code=False):
        raise Built(attn)

    monkeypatch.setattr(meta_init, "empty_model", empty_model)
    model = SimpleNamespace(
        attn_implementation="auto",
        path=tiny_model_dir,
        trust_remote_code=False,
        override_config={},
        external_lib=None,
        enable_gradient_checkpointing=False,
    )
    worker = SimpleNamespace(sections=SimpleNamespace(model=model), device="cuda")
    with pytest.raises(Built, match="^sdpa$"):
        ActorRolloutRefWorker._build_module(worker, fsdp_cfg=None, trainable=False)


@pytest.mark.parametrize("name,dist", [("flash_attention_2", "flash-attn"), ("flash_attention_3", "flash-attn-3")])
def test_explicit_flash_attention_without_its_package_fails_at_preflight_in_one_line(
    no_flash, compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir, tmp_path, name, dist
):
    from omegaconf import OmegaConf

    from luffy_pool.run.preflight import PreflightError, preflight

    cfg = compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path / "out")))
    preflight(cfg)  # auto: fine
    OmegaConf.update(cfg, "actor_rollout_ref.model.attn_implementation", name, merge=False)
    with pytest.raises(PreflightError) as err:
        preflight(cfg)
    assert err.value.errors == [
        f"'actor_rollout_ref.model.attn_implementation'={name} needs the {dist} package, which is not installed "
        f"here (pip install {dist}, or set actor_rollout_ref.model.attn_implementation=auto to fall back to sdpa)"
    ]
