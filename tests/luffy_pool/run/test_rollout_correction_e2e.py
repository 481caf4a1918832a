"""Rollout correction end to end: the tiny LUFFY run with ``algorithm.rollout_correction.rollout_is=token`` and
``actor_rollout_ref.rollout.calculate_log_probs=True`` logs ``rollout_corr/*`` each step; without
``calculate_log_probs`` the run is refused before any worker starts, naming both keys."""

import json
import math

import pytest

from luffy_pool.config.check import ConfigError, check_config

RC = "algorithm.rollout_correction"
CALC = "actor_rollout_ref.rollout.calculate_log_probs"


def test_rollout_is_without_engine_log_probs_is_refused_before_any_worker(
    compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir, tmp_path, monkeypatch
):
    import luffy_pool.run.launcher as launcher
    from luffy_pool.run.main_mix_ppo import run

    def no_workers(_config):
        raise AssertionError("the launcher must not be reached")

    monkeypatch.setattr(launcher, "run_ppo", no_workers)
    config = compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path)) + [f"{RC}.rollout_is=token"])
    with pytest.raises(ConfigError) as err:
        run(config)
    assert err.value.errors == [
        f"'{RC}.rollout_is'='token' needs '{CALC}'=True (the weights compare the engine's "
        "sampling log-probs with the actor's); set it or set the correction to null"
    ]


def _two_steps(rollout, extra, model_dir, task_dir, tmp_path, compose_config, luffy_overrides, fit_with_fingerprints):
    """Two checked training steps with ``extra`` overrides; asserts the weights moved; the metrics rows."""
    config = compose_config(luffy_overrides(model_dir, task_dir, str(tmp_path), rollout=rollout, steps=2) + extra)
    check_config(config)
    _, before, _, after = fit_with_fingerprints(config)
    assert all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    return rows


@pytest.mark.e2e
@pytest.mark.parametrize("rollout", ["vllm", "hf"])
def test_token_is_two_steps_logs_rollout_corr(
    rollout,
    tiny_model_dir,
    tiny_task_dir,
    tmp_path,
    ray_session,
    compose_config,
    luffy_overrides,
    fit_with_fingerprints,
):
    rows = _two_steps(
        rollout,
        [f"{RC}.rollout_is=token", f"{CALC}=True"],
        tiny_model_dir,
        tiny_task_dir,
        tmp_path,
        compose_config,
        luffy_overrides,
        fit_with_fingerprints,
    )
    for r in rows:
        corr = {k: v for k, v in r.items() if k.startswith("rollout_corr/")}
        print(f"[{rollout}] step {r['step']}: " + ", ".join(f"{k}={v:.6g}" for k, v in sorted(corr.items())))
        assert {
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_max",
            "rollout_corr/rollout_is_min",
            "rollout_corr/rollout_is_ratio_fraction_high",
            "rollout_corr/kl",
            "rollout_corr/k3_kl",
        } <= set(corr)
        assert all(math.isfinite(v) for v in corr.values())
        # the engine samples from the weights the actor just pushed (float32 on both sides): pi_rollout ~ pi_old
        assert r["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.05)
        assert abs(r["rollout_corr/kl"]) < 0.05 and r["rollout_corr/k3_kl"] < 0.05
        assert "timing_s/rollout_corr" in r


@pytest.mark.e2e
def test_bypass_mode_trains_without_the_old_log_prob_pass_and_validates_on_one_push(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides, fit_with_fingerprints
):
    """vLLM engines, LUFFY's full-trace slots (off-policy tokens the engine did not sample), bypass mode: no
    old-log-prob pass, finite losses, the weights move; validation at step 2 in four chunks of 2 prompts, each
    generated on the one push before the first (a chunk without a push is refused by the sharding manager)."""
    rows = _two_steps(
        "vllm",
        [f"{RC}.bypass_mode=True", f"{CALC}=True", "data.val_batch_size=2"],
        tiny_model_dir,
        tiny_task_dir,
        tmp_path,
        compose_config,
        luffy_overrides,
        fit_with_fingerprints,
    )
    for r in rows:
        assert "timing_s/old_log_prob" not in r  # the engine's log-probs were the old ones
        assert all(math.isfinite(r[k]) for k in ("actor/pg_loss", "actor/ppo_kl", "actor/off_pg_loss"))
    assert math.isfinite(rows[1]["val/avg_score"]) and "timing_s/testing" in rows[1]
