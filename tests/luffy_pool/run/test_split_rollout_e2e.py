"""Split engines end to end (``actor_rollout_ref.hybrid_engine=False``, ``trainer.rollout_pipeline=one_step_off``): the
tiny LUFFY run on 1 training rank + 1 rollout rank, 3 steps, validation at step 2 while step 3's batch is in flight.
The weights cross over the gloo weight group; each step logs its staleness (0, then 1) and finite losses."""
import json
import math

import pytest

from luffy_pool.config.check import check_config

SPLIT = ["actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.n_gpus_per_node=1",
         "trainer.n_gpus_per_node=1", "trainer.rollout_pipeline=one_step_off"]


@pytest.mark.e2e
def test_one_step_off_on_split_ranks_trains_three_steps(tiny_model_dir, tiny_task_dir, tmp_path, ray_session,
                                                        compose_config, luffy_overrides, fit_with_fingerprints):
    config = compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), steps=3) + SPLIT)
    check_config(config)
    trainer, before, _, after = fit_with_fingerprints(config)
    assert trainer.rollout_wg is not None and trainer.rollout_wg.world_size == 1 and trainer.wg.world_size == 1
    assert trainer.pipeline.pending is None  # nothing left generating after the last step
    assert all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    train = [r for r in rows if "rollout/staleness" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    # batch 1 is generated before any update; batches 2 and 3 were launched before the update before them
    assert [r["rollout/staleness"] for r in train] == [0, 1, 1]
    for r in train:
        losses = {k: v for k, v in r.items() if k.startswith("actor/") and "loss" in k}
        assert losses and all(math.isfinite(v) for v in losses.values()), losses
        assert r["timing_s/weight_sync"] > 0
    assert any("val/avg_score" in r for r in rows if r["step"] == 2)
