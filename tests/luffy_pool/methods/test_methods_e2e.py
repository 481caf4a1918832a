"""End to end: ``algorithm.method=<m>`` trains 2 steps on the tiny model and task with LUFFY's tiny overrides
(n=4, one full demonstration row per prompt, 2 FSDP ranks, HF rollout) and logs its own metrics, finite."""
import json
import math

import pytest

pytestmark = pytest.mark.e2e

# the metrics each method's blocks add (actor/* from its loss, hpt/* srft/* from its driver stage)
METHOD_METRICS = {
    "hpt": ("hpt/sft_group_fraction", "hpt/mean_successes", "actor/sft_loss", "actor/on_pg_loss"),
    "srft": ("srft/correct_fraction", "actor/srft/H", "actor/srft/sft_coef", "actor/srft/on_coef", "actor/off_pg_loss"),
    "chord": ("actor/mu", "actor/expert/sft_phi_loss", "actor/usual/pg_loss", "actor/loss"),
    "grpo": ("actor/pg_clipfrac", "actor/ppo_kl"),
    # the random tiny model solves nothing, so ExGRPO stays in its on-policy warm-up here (its mixed phase and
    # pool: tests/luffy_pool/run/test_exgrpo_resume_e2e.py)
    "exgrpo": ("exgrpo/solved_ratio", "exgrpo/mixed", "exgrpo/pool_questions", "actor/on_pg_loss",
               "actor/on_pg_clipfrac", "actor/ppo_kl"),
}
# grpo, exgrpo: the tiny LUFFY overrides give one demonstration slot per group; both replace it (n_prefix=0)
NO_OFF_POLICY_SLOT = {"grpo": True, "exgrpo": True}


@pytest.mark.parametrize("method", sorted(METHOD_METRICS))
def test_method_trains_two_steps(method, tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config,
                                 luffy_overrides, fit_with_fingerprints):
    overrides = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), steps=2)
    overrides = [o for o in overrides if not o.startswith("trainer.test_freq")] + ["trainer.test_freq=-1"]
    config = compose_config(overrides + [f"algorithm.method={method}"])
    trainer, before, _, after = fit_with_fingerprints(config)
    assert all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    assert trainer.method.name == method
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in METHOD_METRICS[method]:
            assert key in r, (method, key)
            assert math.isfinite(r[key]), (method, key, r[key])
        assert r["rollout/full_trace_slots"] == (0 if NO_OFF_POLICY_SLOT.get(method) else 4)
    if method == "chord":  # CHORD-phi defaults: mu constant 0.1
        assert [r["actor/mu"] for r in rows] == pytest.approx([0.1, 0.1])
    if method == "hpt":
        assert all(0.0 <= r["hpt/sft_group_fraction"] <= 1.0 for r in rows)
    if method == "exgrpo":  # nothing solved: warm-up throughout, nothing collected, no question replayed
        assert [(r["exgrpo/mixed"], r["exgrpo/pool_questions"], r["exgrpo/replayed_questions"]) for r in rows] == \
            [(0.0, 0, 0), (0.0, 0, 0)]
