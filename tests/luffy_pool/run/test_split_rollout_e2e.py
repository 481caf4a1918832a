"""Split engines end to end (``actor_rollout_ref.hybrid_engine=False``, ``trainer.rollout_pipeline=one_step_off``): the
tiny LUFFY run on 1 training rank + 1 rollout rank, 4 steps with a checkpoint every 2 and validation at steps 2 and 4.
The weights cross over the gloo weight group; each step logs its staleness and finite losses. A second run resumed
from the step-2 checkpoint trains steps 3 and 4 exactly as the uninterrupted run did (the batch after a checkpoint is
generated from the checkpoint's weights in both)."""
import json
import math

import pytest

from luffy_pool.config.check import check_config

SPLIT = ["actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.n_gpus_per_node=1",
         "trainer.n_gpus_per_node=1", "trainer.rollout_pipeline=one_step_off", "trainer.save_freq=2"]
SAME = ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "batch/on_solved", "rollout/staleness",
        "val/avg_score")


def _rows(folder):
    return {r["step"]: r for r in (json.loads(line) for line in open(folder / "metrics.jsonl"))}


@pytest.mark.e2e
def test_one_step_off_on_split_ranks_trains_and_resumes_equal(tiny_model_dir, tiny_task_dir, tmp_path, ray_session,
                                                              compose_config, luffy_overrides, fit_with_fingerprints):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    config = compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(full), steps=4) + SPLIT)
    check_config(config)
    trainer, before, _, after = fit_with_fingerprints(config)
    assert trainer.rollout_wg is not None and trainer.rollout_wg.world_size == 1 and trainer.wg.world_size == 1
    assert trainer.pipeline.pending is None  # nothing left generating after the last step
    assert all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    rows = _rows(full)
    assert sorted(rows) == [1, 2, 3, 4]
    # batch 1 is generated before any update, batch 2 was launched before update 1; step 2 is saved, so batch 3 is
    # generated from the saved weights (not prefetched) and batch 4 launched before update 3
    assert [rows[s]["rollout/staleness"] for s in (1, 2, 3, 4)] == [0, 1, 0, 1]
    for r in rows.values():
        losses = {k: v for k, v in r.items() if k.startswith("actor/") and "loss" in k}
        assert losses and all(math.isfinite(v) for v in losses.values()), losses
        assert r["timing_s/weight_sync"] > 0
    assert "val/avg_score" in rows[2] and "val/avg_score" in rows[4]

    ckpt = full / "global_step_2"
    config = compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(resumed), steps=4) + SPLIT
                            + [f"trainer.resume_mode={ckpt}"])
    _, _, _, after_resumed = fit_with_fingerprints(config)
    again = _rows(resumed)
    assert sorted(again) == [3, 4]
    for step in (3, 4):
        assert {k: again[step].get(k) for k in SAME} == {k: rows[step].get(k) for k in SAME}, step
    assert after_resumed == after  # fp32 on both sides, same world sizes: the same weights
