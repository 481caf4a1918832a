"""End to end: 3 training steps with self-replay on (Ray, 2 FSDP ranks, HF rollout, tiny model).

The random tiny model solves nothing, so every group fails and no success of its own ever enters the
buffer. The buffer is therefore seeded before ``fit`` with the task's traces as if an earlier checkpoint
(step 0) had produced them, with behaviour log-prob log(0.5) per token: every group must then get a
replayed trace in its off-policy slot (which has no dataset trace: sample_target_ratio=0), graded
correct, weighted by p / 0.5 in the loss, and the buffer must be in the step-3 checkpoint.
"""

import json
import math
import os

import pytest

pytestmark = pytest.mark.e2e


def test_self_replay_three_steps(tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides):
    from luffy_pool.run.launcher import build_trainer
    from luffy_pool.replay.buffer import SelfReplayBuffer

    overrides = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), rollout="hf") + [
        "data.sample_target_ratio=0.0",
        "data.self_replay.enable=True",
        "data.self_replay.max_age=10",
        "actor_rollout_ref.actor.use_off_policy_probs=True",
        "trainer.save_freq=3",
        "trainer.test_freq=-1",
    ]
    trainer, close = build_trainer(compose_config(overrides))
    try:
        ds = trainer.train_dataloader.dataset
        ds_ratio, ds.sample_target_ratio = ds.sample_target_ratio, 1.0  # read the traces the run itself hides
        seeded = 0
        for item, prompt_id in enumerate(ds.prompt_ids):
            ids = ds.target_token_ids(item, ds._records[item]["target"])
            trainer.self_replay.buffer.insert(prompt_id, ids, [math.log(0.5)] * (len(ids) + 1), step=0)
            seeded += 1
        ds.sample_target_ratio = ds_ratio
        before = trainer.wg.actor_weight_fingerprint()
        trainer.fit()
        after = trainer.wg.actor_weight_fingerprint()
    finally:
        close()
    assert all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["batch/avg_prefix_ratio"] == pytest.approx(0.25)  # slot 0 of n=4 is the off-policy slot
        assert r["replay/used"] == 4, "every group of the random model fails and gets one replayed trace"
        assert r["replay/age_mean"] == r["step"]  # the seeded traces are from step 0
        assert r["replay/replayed_score"] == 1.0 and r["on_off_metrics/off_score"] == 1.0
        assert r["replay/size"] == seeded and r["replay/inserted"] == 0
        assert r["replay/generated_on_score"] == 0.0
        assert 0.0 < r["actor/off_policy_prob"] < 1.0
        # importance weight p / 0.5 (no shaping): mean off ratio = 2 x mean p
        assert r["actor/off_ratio_mean"] == pytest.approx(2 * r["actor/off_policy_prob"], rel=1e-3)
    saved = tmp_path / "global_step_3" / "self_replay"
    restored = SelfReplayBuffer()
    restored.load(str(saved))
    assert len(restored) == seeded
    assert os.path.exists(saved / "replay_buffer.json")
