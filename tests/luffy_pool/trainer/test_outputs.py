"""trainer.rollout_data_dir, trainer.val_generations_to_log and +trainer.val_only, on the real trainer's
validation loop with an in-process stand-in for the worker group (fixed responses, no Ray)."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from luffy_pool.config.sections import ConfigSections
from luffy_pool.run.launcher import build_dataloader
from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer
from luffy_pool.trainer.outputs import dump_rollouts, rollout_records, validation_samples
from verl.protocol import DataProto

RESPONSE = 6


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _rolled_out(tokenizer, prompts: list[str], responses: list[str], width=16) -> DataProto:
    rows = len(prompts)
    p_ids = torch.full((rows, width), tokenizer.pad_token_id)
    r_ids = torch.full((rows, RESPONSE), tokenizer.pad_token_id)
    mask = torch.zeros((rows, width + RESPONSE), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_tok, r_tok = tokenizer.encode(p, add_special_tokens=False), tokenizer.encode(r, add_special_tokens=False)
        p_ids[i, width - len(p_tok) :] = torch.tensor(p_tok)  # left-padded prompt
        r_ids[i, : len(r_tok)] = torch.tensor(r_tok)
        mask[i, width - len(p_tok) : width + len(r_tok)] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": p_ids,
            "responses": r_ids,
            "attention_mask": mask,
            "input_ids": torch.cat([p_ids, r_ids], -1),
        }
    )


def test_rollout_records_decode_each_row_and_dump_one_file_per_step(tokenizer, tmp_path):
    batch = _rolled_out(tokenizer, ["1+1=", "2+2="], ["2", "5"])
    scores = torch.zeros(2, RESPONSE)
    scores[0, 0] = 1.0
    batch.batch["token_level_scores"] = scores
    batch.batch["advantages"] = torch.tensor([[0.5] * RESPONSE, [-0.5] * RESPONSE])
    batch.batch["prefix_mask"] = torch.tensor([[1] + [0] * (RESPONSE - 1), [0] * RESPONSE])
    batch.non_tensor_batch["uid"] = np.array(["g0", "g0"], dtype=object)
    batch.non_tensor_batch["data_source"] = np.array(["arith", "arith"], dtype=object)
    path = dump_rollouts(str(tmp_path / "rollouts"), 3, rollout_records(batch, tokenizer, step=3))
    assert path.endswith("/rollouts/3.jsonl")
    rows = [json.loads(ln) for ln in open(path)]
    assert [(r["input"], r["output"], r["score"], r["advantage"], r["prefix_tokens"]) for r in rows] == [
        ("1+1=", "2", 1.0, 0.5, 1),
        ("2+2=", "5", 0.0, -0.5, 0),
    ]
    assert {r["uid"] for r in rows} == {"g0"} and rows[0]["step"] == 3 and rows[0]["data_source"] == "arith"


def test_validation_samples_keep_the_first_rows(tokenizer):
    batch = _rolled_out(tokenizer, ["a", "b", "c"], ["1", "2", "3"])
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert validation_samples(batch, scores, tokenizer, 2) == [
        {"input": "a", "output": "1", "score": 1.0},
        {"input": "b", "output": "2", "score": 0.0},
    ]
    assert validation_samples(batch, scores, tokenizer, 0) == []


class FixedResponsesGroup:
    """A 1-rank worker group whose engine answers every prompt with the same few tokens."""

    world_size = 1

    def __init__(self, tokenizer, n_val):
        self.tokenizer, self.n_val, self.calls = tokenizer, n_val, []

    def update_weights(self):
        self.calls.append("update_weights")
        return [{"timing_s/weight_sync": 0.0}]

    def generate_validation(self, gen_batch):
        self.calls.append(len(gen_batch))
        prompts = gen_batch.batch["input_ids"].repeat_interleave(self.n_val, 0)
        mask_p = gen_batch.batch["attention_mask"].repeat_interleave(self.n_val, 0)
        ids = self.tokenizer.encode("42", add_special_tokens=False)
        responses = torch.full((len(prompts), RESPONSE), self.tokenizer.pad_token_id)
        responses[:, : len(ids)] = torch.tensor(ids)
        mask_r = torch.zeros_like(responses)
        mask_r[:, : len(ids)] = 1
        return DataProto.from_dict(
            tensors={
                "prompts": prompts,
                "responses": responses,
                "input_ids": torch.cat([prompts, responses], -1),
                "attention_mask": torch.cat([mask_p, mask_r], -1),
            }
        )

    def __getattr__(self, name):
        raise AssertionError(f"val_only must not call {name}")


class RecordingTracker:
    def __init__(self):
        self.metrics, self.generations = [], []

    def log(self, data, step):
        self.metrics.append((step, dict(data)))

    def log_generations(self, samples, step):
        self.generations.append((step, samples))


def _score_even_rows(batch):
    scores = torch.zeros(len(batch), RESPONSE)
    scores[::2, 0] = 1.0
    return scores, {}


def _trainer(compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path, *extra):
    cfg = compose_config(
        [
            f"data.train_files={tiny_task_dir}/train.parquet",
            f"data.val_files={tiny_task_dir}/test.parquet",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.train_batch_size=4",
            "data.max_prompt_length=96",
            f"data.max_response_length={RESPONSE}",
            "data.val_max_rows=5",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.n_val=2",
            "trainer.total_training_steps=3",
            f"trainer.default_local_dir={tmp_path}",
            *extra,
        ]
    )
    loader, _, val, collate = build_dataloader(ConfigSections.from_config(cfg), tokenizer)
    tracker = RecordingTracker()
    group = FixedResponsesGroup(tokenizer, n_val=2)
    trainer = MIXRayPPOTrainer(
        cfg,
        tokenizer,
        group,
        _score_even_rows,
        _score_even_rows,
        loader,
        val_dataset=val,
        collate_fn=collate,
        tracker=tracker,
    )
    return trainer, tracker, group


def test_val_generations_to_log_sends_that_many_samples_to_the_tracker(
    compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path
):
    trainer, tracker, _ = _trainer(
        compose_config,
        tiny_model_dir,
        tiny_task_dir,
        tokenizer,
        tmp_path,
        "trainer.val_generations_to_log=3",
        "data.val_batch_size=2",
    )
    metrics = trainer.validate()
    assert metrics["val/avg_score"] == pytest.approx(0.5)  # 5 prompts x 2 samples, even rows score 1
    ((step, samples),) = tracker.generations
    assert step == 0 and len(samples) == 3 and [s["score"] for s in samples] == [1.0, 0.0, 1.0]
    assert all(s["output"] == "42" and s["input"] for s in samples)
    assert samples[0]["input"] == samples[1]["input"] != samples[2]["input"]  # n_val samples of one prompt first


def test_val_generations_to_log_zero_logs_none(compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path):
    trainer, tracker, _ = _trainer(compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path)
    trainer.validate()
    assert tracker.generations == []


def test_val_only_validates_once_and_trains_nothing(compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path):
    trainer, tracker, group = _trainer(
        compose_config,
        tiny_model_dir,
        tiny_task_dir,
        tokenizer,
        tmp_path,
        "+trainer.val_only=True",
        "+trainer.val_before_train=False",
    )
    metrics = trainer.fit()
    # one validation call after its weight push, no training step
    assert trainer.global_steps == 0 and group.calls == ["update_weights", 5]
    assert metrics["val/avg_score"] == pytest.approx(0.5) and tracker.metrics == [(0, metrics)]


def test_one_push_serves_every_validation_chunk_the_engine_held_until_the_last(
    compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path
):
    from verl.workers.sharding_manager.fsdp_sharding_manager import HOLD_WEIGHTS_KEY

    trainer, _, group = _trainer(
        compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path, "data.val_batch_size=2"
    )
    generate = group.generate_validation

    def recording(gen_batch):
        group.calls.append(("hold", gen_batch.meta_info[HOLD_WEIGHTS_KEY]))
        return generate(gen_batch)

    group.generate_validation = recording
    trainer.validate()
    # 5 prompts in chunks of 2: one push, then three generations holding the weights for the next but the last
    assert group.calls == ["update_weights", ("hold", True), 2, ("hold", True), 2, ("hold", False), 1]
