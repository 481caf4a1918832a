"""Split engines with ``trainer.rollout_pipeline=one_step_off`` and validation on a step that prefetches: the tiny
LUFFY run on 1 training rank + 1 rollout rank, 2 steps, ``test_freq=1`` and ``save_freq=2`` (so step 1 validates with
batch 2 launched before its update). The calls on the rollout group are recorded in order: batch 2 is finished before
the push that validation needs, so no push (and no validation) is ever queued behind a generation, where the actor's
rank 0 would wait in the broadcast for the whole generation.
"""

import json

import pytest

from luffy_pool.config.check import check_config
from tests.helpers.rollout_calls import queued_behind_a_generation, record_rollout_calls

pytestmark = pytest.mark.e2e

SPLIT = [
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.n_gpus_per_node=1",
    "trainer.rollout_pipeline=one_step_off",
    "trainer.test_freq=1",
    "trainer.save_freq=2",
]


def test_validation_on_a_prefetching_step_finishes_the_batch_in_flight_before_its_push(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides
):
    from luffy_pool.run.launcher import build_trainer

    config = compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), steps=2) + SPLIT)
    check_config(config)
    trainer, close = build_trainer(config)
    try:
        events = record_rollout_calls(trainer)
        trainer.fit()
    finally:
        close()
    assert events == [
        "push",
        "generate 1",
        "generated 1",  # step 1: batch 1 on the initial weights
        "push",
        "generate 2",  # batch 2 launched before update 1 (step 1 is not saved)
        "generated 2",
        "push",
        "validate",  # step 1's validation: batch 2 finished first, then update 1 pushed
        "push",
        "validate",  # step 2 (last: nothing prefetched): validation, then the save
    ]
    assert queued_behind_a_generation(events) == []
    rows = {r["step"]: r for r in (json.loads(line) for line in open(tmp_path / "metrics.jsonl") if line.strip())}
    assert [rows[s]["rollout/staleness"] for s in (1, 2)] == [0, 1]  # batch 2 kept, trained at its own step
    assert "val/avg_score" in rows[1] and "val/avg_score" in rows[2]
    assert trainer.pipeline.pending is None
