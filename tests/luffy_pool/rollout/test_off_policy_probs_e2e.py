"""End to end: ``use_off_policy_probs`` with LUFFY's dataset column of behaviour probabilities
(``target_ds_qwen_7b_probs``) and no extra files: 1 step on 2 CPU FSDP ranks. Every target token's behaviour
probability is 0.5, so the off-policy weight becomes p / 0.5 (LUFFY's IS ratio) instead of the shaped f(p)."""

import json

import pandas as pd
import pytest

pytestmark = pytest.mark.e2e


def test_dataset_column_of_behaviour_probs_reaches_the_loss(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides
):
    from transformers import AutoTokenizer

    from luffy_pool.run.launcher import build_trainer
    from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    frame = pd.read_parquet(f"{tiny_task_dir}/train.parquet")
    plain = RLHFDatasetWithTarget(
        f"{tiny_task_dir}/train.parquet", tokenizer, max_prompt_length=96, max_target_length=48
    )
    frame["target_ds_qwen_7b_probs"] = [
        [0.5] * (len(plain.target_token_ids(i, t)) + 1) for i, t in enumerate(frame["target"])
    ]  # every token plus the EOS
    frame.to_parquet(tmp_path / "train.parquet", index=False)
    overrides = [
        o
        for o in luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path / "run"), steps=1)
        if not o.startswith("data.train_files=")
    ]
    config = compose_config(
        overrides + [f"data.train_files={tmp_path}/train.parquet", "actor_rollout_ref.actor.use_off_policy_probs=True"]
    )
    trainer, close = build_trainer(config)
    try:
        last = trainer.fit()
    finally:
        close()
    row = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")][-1]
    # off_ratio = p / (0.5 + 1e-6) on every off-policy token: its mean is twice the mean off-policy probability
    assert row["actor/off_ratio_mean"] == pytest.approx(2 * row["actor/off_policy_prob"], rel=1e-4)
    assert last["actor/off_policy_prob"] > 0
    # every behaviour probability is known here: the unknown-probability counters (docs/DESIGN.md §1 item 3) are logged, at 0
    assert (row["batch/behaviour_prob_unknown_rows"], row["batch/behaviour_prob_unknown_tokens"]) == (0, 0)
