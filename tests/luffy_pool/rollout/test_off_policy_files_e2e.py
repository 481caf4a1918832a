"""End to end: ``data.off_policy_files`` (an extra trajectory file with behaviour log-probs) for 2 training steps
on 2 CPU FSDP ranks, with the run-output keys on (rollout_data_dir, val_generations_to_log, default_hdfs_dir),
then the launcher's close() releases the Ray placement groups (it once raised AttributeError and leaked
them when off_policy_files was set)."""

import json
import math

import pandas as pd
import pytest

pytestmark = pytest.mark.e2e


def _extra_traces(task_dir, tokenizer, path):
    """A second, correct trace per training prompt: token ids plus a behaviour log-prob per token and EOS."""
    rows = []
    for _, row in pd.read_parquet(f"{task_dir}/train.parquet").iterrows():
        answer = row["reward_model"]["ground_truth"]
        ids = tokenizer.encode(
            f"<think>\nthe answer is {answer}\n</think>\n\\boxed{{{answer}}}", add_special_tokens=False
        )
        rows.append(
            {
                "index": int(row["extra_info"]["index"]),
                "trace": "",
                "token_ids": ids,
                "logprobs": [-0.25] * len(ids) + [-0.05],
            }
        )
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def test_two_steps_with_an_extra_trajectory_file_and_run_outputs(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides
):
    from ray.util import placement_group_table
    from transformers import AutoTokenizer

    from luffy_pool.run.launcher import build_trainer
    from verl.utils.checkpoint import layout

    extra = _extra_traces(tiny_task_dir, AutoTokenizer.from_pretrained(tiny_model_dir), str(tmp_path / "extra.parquet"))
    run, mirror, rollouts = tmp_path / "run", tmp_path / "mirror", tmp_path / "rollouts"
    config = compose_config(
        luffy_overrides(tiny_model_dir, tiny_task_dir, str(run), steps=2)
        + [
            f"data.off_policy_files=[{extra}]",
            "actor_rollout_ref.rollout.n_prefix=2",
            "actor_rollout_ref.actor.use_off_policy_probs=True",
            "trainer.save_freq=2",
            f"trainer.default_hdfs_dir={mirror}",
            f"trainer.rollout_data_dir={rollouts}",
            "trainer.val_generations_to_log=3",
        ]
    )
    pgs_before = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    trainer, close = build_trainer(config)
    try:
        assert trainer.off_policy_pool is not None and trainer.off_policy_pool.has_extra_traces
        assert len({k for k, v in placement_group_table().items() if v["state"] != "REMOVED"} - pgs_before) == 1
        last = trainer.fit()
    finally:
        close()
    assert {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"} == pgs_before, (
        "placement group leaked"
    )

    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # 4 prompts x 2 prefix slots: one takes the dataset target, the other the extra file's trace
        assert r["rollout/full_trace_slots"] == 8 and r["rollout/extra_trace_slots"] == 4
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float))
    assert 0.0 < last["actor/off_policy_prob"]
    for step in (1, 2):  # rollout_data_dir: one file per step, one line per row
        dumped = [json.loads(line) for line in open(rollouts / f"{step}.jsonl")]
        assert len(dumped) == 16 and sum(r["prefix_tokens"] > 0 for r in dumped) == 8
        assert any("the answer is" in r["output"] for r in dumped)  # an extra trace was the prefix of a slot
    generations = [json.loads(line) for line in open(run / "val_generations.jsonl")]
    assert [g["step"] for g in generations] == [2, 2, 2]  # test_freq=2: validated after the last step
    assert layout.read_tracker(str(mirror)) == 2 and (mirror / "global_step_2" / layout.DATA_FILE).exists()
