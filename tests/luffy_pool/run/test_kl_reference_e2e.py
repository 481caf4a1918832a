"""H11 end to end: the YAML's default reference worker with the KL loss, and with the KL penalty in the reward.

tests/conftest.py's ``tiny_overrides`` turn off ``ref.use_ref``, ``actor.use_kl_loss`` and set
``algorithm.kl_ctrl.kl_coef=0`` for every e2e run, as LUFFY's train.sh does; here those three overrides are
dropped so the YAML's defaults run: a reference worker (``ref`` at its YAML defaults), the k3 KL loss with
coefficient 0.001, or (``use_kl_loss=False``) KL-in-reward with the fixed controller's beta 0.001. Two steps on
2 FSDP ranks (HF rollout): at step 1 the policy is the reference, so the KL is 0; at step 2 it has moved.
"""

import json
import math

import pytest

pytestmark = pytest.mark.e2e

DROPPED = ("actor_rollout_ref.ref.use_ref=", "actor_rollout_ref.actor.use_kl_loss=", "algorithm.kl_ctrl.kl_coef=")


def _run(tmp_path, compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir, fit_with_fingerprints, extra):
    overrides = [
        o
        for o in luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), rollout="hf", steps=2)
        if not o.startswith(DROPPED)
    ]
    config = compose_config(overrides + extra)
    assert config.actor_rollout_ref.ref.use_ref is True  # the YAML's default
    trainer, before, _, after = fit_with_fingerprints(config)
    assert all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    return config, rows


def test_default_reference_worker_with_the_kl_loss(
    tmp_path, ray_session, compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir, fit_with_fingerprints
):
    config, rows = _run(
        tmp_path, compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir, fit_with_fingerprints, []
    )
    actor = config.actor_rollout_ref.actor
    assert (actor.use_kl_loss, actor.kl_loss_type, actor.kl_loss_coef) == (True, "low_var_kl", 0.001)
    for r in rows:
        assert r["actor/kl_coef"] == pytest.approx(0.001, rel=1e-12)  # a token-weighted mean of a constant
        assert math.isfinite(r["actor/kl_loss"]) and r["actor/kl_loss"] >= 0.0
        assert r["timing_s/ref"] > 0.0  # the reference worker ran its log-prob pass
        assert "critic/kl" not in r  # the KL is in the loss, not in the reward
    # step 1: one mini-batch, the policy still equals the frozen reference; step 2: it has moved away
    assert rows[0]["actor/kl_loss"] < 1e-6
    assert rows[1]["actor/kl_loss"] > 1e-6


def test_default_reference_worker_with_the_kl_penalty_in_the_reward(
    tmp_path, ray_session, compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir, fit_with_fingerprints
):
    config, rows = _run(
        tmp_path,
        compose_config,
        luffy_overrides,
        tiny_model_dir,
        tiny_task_dir,
        fit_with_fingerprints,
        ["actor_rollout_ref.actor.use_kl_loss=False"],
    )
    alg = config.algorithm
    assert (alg.kl_penalty, alg.kl_ctrl.type, alg.kl_ctrl.kl_coef) == ("kl", "fixed", 0.001)  # YAML defaults
    for r in rows:
        assert r["critic/kl_coeff"] == 0.001 and math.isfinite(r["critic/kl"])
        assert "actor/kl_loss" not in r
    assert abs(rows[0]["critic/kl"]) < 1e-6
    assert abs(rows[1]["critic/kl"]) > 1e-6
