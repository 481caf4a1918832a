"""The trainer's rollout path: the dataset's per-prompt targets ``tgt_input_ids [B, T]`` reach the
workers as per-slot traces ``[B, n, T]`` (behaviour log-probs ``[B, n, T + 1]``) through the off-policy pool,
with or without extra trace files, split over ranks on the prompt dim. In process, no Ray: the trainer's real
``_rollout``, the real DP_COMPUTE_PROTO dispatch/collect (each chunk pickled as Ray would), the real worker
``generate_sequences`` and slot plan, with a scripted engine instead of vLLM."""

import pickle

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from luffy_pool.config.sections import ConfigSections
from luffy_pool.run.launcher import build_dataloader
from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer
from luffy_pool.rollout.off_policy_pool import OffPolicyPool, strip_right_padding
from verl.protocol import DataProto
from verl.single_controller.base.decorator import collect_dp_compute_data_proto, dispatch_dp_compute_data_proto
from verl.workers.rollout.base import BaseRollout, GenerationOutput

N, RESPONSE, MAX_PREFIX = 4, 56, 48  # every tiny target fits in MAX_PREFIX
REPLY = [7, 8]  # every engine request is answered with these tokens, then EOS


class ScriptedEngine(BaseRollout):
    def __init__(self, eos):
        self.eos = eos

    def generate_token_ids(self, prompt_token_ids, max_tokens, sampling):
        return GenerationOutput(token_ids=[(REPLY + [self.eos])[:m] for m in max_tokens])

    def update_weights(self, named_tensors):
        pass


class _NoSync:
    """The sharding manager's two calls without weights: the push is counted, entering checks it came first."""

    pushes = 0

    def sync_weights(self):
        self.pushes += 1
        return 0.0

    def hold(self, hold_weights):  # the generation context (FSDPShardingManager.hold)
        return self

    def __enter__(self):
        assert self.pushes, "generation before the update_weights stage"
        return self

    def __exit__(self, *exc):
        return False


class TwoRankGroup:
    """Stand-in for the Ray worker group: the real DP_COMPUTE_PROTO split, pickled chunks, the real worker method."""

    world_size = 2

    def __init__(self, tokenizer):
        from luffy_pool.workers.mix_fsdp_worker import MIXActorRolloutRefWorker
        from luffy_pool.rollout.slot_plan import MixRolloutPlanner
        from luffy_pool.config.compose import compose_config, rollout_section
        from verl.workers.config_sections import WorkerSections
        from verl.workers.rollout.tp_group import TPGeneration

        worker = MIXActorRolloutRefWorker.__new__(MIXActorRolloutRefWorker)
        worker.sections = WorkerSections.from_config(
            compose_config(["actor_rollout_ref.rollout.seed=0", "actor_rollout_ref.rollout.name=hf"]).actor_rollout_ref
        )
        worker.planner = MixRolloutPlanner(
            ScriptedEngine(tokenizer.eos_token_id),
            rollout_section(n=N, response_length=RESPONSE, n_val=1),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        worker.sharding_manager = _NoSync()
        worker._is_rollout, worker.role = True, "actor_rollout"
        worker.tp_generation = TPGeneration.create(0, 1, 1)
        self.worker, self.sent = worker, None

    def update_weights(self) -> list:
        return [self.worker.update_weights()]  # ONE_TO_ALL: one answer per rank (both ranks share this worker)

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        self.sent = {k: (tuple(v.shape), v.dtype) for k, v in gen_batch.batch.items()}
        (chunks,), _ = dispatch_dp_compute_data_proto(self, gen_batch)
        self.chunk_shapes = [{k: tuple(v.shape) for k, v in c.batch.items()} for c in chunks]
        outs = [self.worker.generate_sequences(pickle.loads(pickle.dumps(c))) for c in chunks]
        return collect_dp_compute_data_proto(self, outs)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def train_with_probs(tiny_task_dir, tokenizer, tmp_path_factory):
    """The tiny training parquet plus LUFFY's behaviour-probability column (0.5 on every target token and the EOS)."""
    from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget

    frame = pd.read_parquet(f"{tiny_task_dir}/train.parquet")
    plain = RLHFDatasetWithTarget(
        f"{tiny_task_dir}/train.parquet", tokenizer, max_prompt_length=96, max_target_length=MAX_PREFIX
    )
    frame["target_ds_qwen_7b_probs"] = [
        [0.5] * (len(plain.target_token_ids(i, t)) + 1) for i, t in enumerate(frame["target"])
    ]
    path = tmp_path_factory.mktemp("probs") / "train.parquet"
    frame.to_parquet(path, index=False)
    return str(path)


def _trainer(compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path, train_file, pool=None):
    cfg = compose_config(
        [
            f"data.train_files={train_file}",
            f"data.val_files={tiny_task_dir}/test.parquet",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.train_batch_size=4",
            "data.max_prompt_length=96",
            f"data.max_response_length={RESPONSE}",
            f"actor_rollout_ref.rollout.n={N}",
            f"actor_rollout_ref.rollout.max_prefix_len={MAX_PREFIX}",
            "actor_rollout_ref.rollout.n_prefix=2",
            "actor_rollout_ref.rollout.min_prefix_ratio=1.0",
            "actor_rollout_ref.rollout.max_prefix_ratio=1.0",
            "trainer.total_training_steps=1",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    loader, _, _, collate = build_dataloader(ConfigSections.from_config(cfg), tokenizer)
    group = TwoRankGroup(tokenizer)
    trainer = MIXRayPPOTrainer(cfg, tokenizer, group, None, None, loader, collate_fn=collate, off_policy_pool=pool)
    trainer.global_steps = 1
    return trainer, group


def _rollout(trainer):
    batch = DataProto.from_single_dict(trainer._next_batch())
    targets = [
        strip_right_padding(row, trainer.tokenizer.pad_token_id) for row in batch.batch["tgt_input_ids"].tolist()
    ]
    ids = list(batch.non_tensor_batch["index"])
    pushed = trainer._update_weights()  # the step's stage before its rollout
    out, _, metrics = trainer._rollout(batch)
    assert pushed == {"timing_s/weight_sync": 0.0} and trainer.wg.worker.sharding_manager.pushes == 1
    return out, metrics, targets, ids


def _response(out, k, eos):
    row = out.batch["responses"][k].tolist()
    return row[: row.index(eos) + 1] if eos in row else row


def test_without_extra_files_the_workers_get_per_slot_traces(
    compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path, train_with_probs
):
    trainer, group = _trainer(compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path, train_with_probs)
    out, metrics, targets, _ = _rollout(trainer)
    eos = tokenizer.eos_token_id
    assert group.sent["tgt_input_ids"] == ((4, N, MAX_PREFIX), torch.long)
    assert group.sent["behaviour_log_probs"] == ((4, N, MAX_PREFIX + 1), torch.float64)
    assert [c["tgt_input_ids"] for c in group.chunk_shapes] == [(2, N, MAX_PREFIX)] * 2  # dim 0 = prompts
    assert [c["behaviour_log_probs"] for c in group.chunk_shapes] == [(2, N, MAX_PREFIX + 1)] * 2
    # the per-slot traces are not kept past the rollout: behaviour log-probs are now one per response token
    assert "tgt_input_ids" not in out.batch.keys()
    assert out.batch["behaviour_log_probs"].shape == out.batch["responses"].shape
    assert len(out) == 4 * N and "rollout/extra_trace_slots" not in metrics
    for b, target in enumerate(targets):
        for j in range(N):
            k = b * N + j
            if j < 2:  # the two full-trace slots both carry the dataset target (the pool has nothing else)
                assert _response(out, k, eos) == target + [eos]
                assert out.batch["prefix_mask"][k].sum() == len(target) + 1
                lps = out.batch["behaviour_log_probs"][k, : len(target) + 1]
                torch.testing.assert_close(lps, torch.full_like(lps, float(np.log(0.5))))
            else:
                assert _response(out, k, eos) == REPLY + [eos] and not out.batch["prefix_mask"][k].any()


def test_with_extra_files_the_workers_get_the_same_shapes(
    compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path, train_with_probs
):
    frame = pd.read_parquet(f"{tiny_task_dir}/train.parquet")
    ids = [int(r["index"]) for r in frame["extra_info"]]
    extra = tmp_path / "extra.parquet"
    pd.DataFrame(
        [{"index": i, "trace": "", "token_ids": [40 + i % 5, 41, 42], "logprobs": [-0.25] * 4} for i in ids]
    ).to_parquet(extra, index=False)
    pool = OffPolicyPool(
        str(extra),
        known_prompt_ids=ids,
        tokenizer=tokenizer,
        max_trace_length=MAX_PREFIX,
        prompt_id_key="index",
        seed=0,
        truncate="cut",
    )  # the run's keys, as the YAML sets them
    trainer, group = _trainer(
        compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path, train_with_probs, pool
    )
    out, metrics, targets, prompt_ids = _rollout(trainer)
    eos = tokenizer.eos_token_id
    assert group.sent["tgt_input_ids"] == ((4, N, MAX_PREFIX), torch.long)
    assert group.sent["behaviour_log_probs"] == ((4, N, MAX_PREFIX + 1), torch.float64)
    assert [c["tgt_input_ids"] for c in group.chunk_shapes] == [(2, N, MAX_PREFIX)] * 2
    # the per-slot traces are not kept past the rollout: behaviour log-probs are now one per response token
    assert "tgt_input_ids" not in out.batch.keys()
    assert out.batch["behaviour_log_probs"].shape == out.batch["responses"].shape
    assert metrics["rollout/extra_trace_slots"] == 4  # target first, then the prompt's one extra trace
    for b, (target, pid) in enumerate(zip(targets, prompt_ids)):
        assert _response(out, b * N, eos) == target + [eos]
        assert _response(out, b * N + 1, eos) == [40 + int(pid) % 5, 41, 42, eos]
        torch.testing.assert_close(out.batch["behaviour_log_probs"][b * N + 1, :4], torch.full((4,), -0.25))
        assert all(_response(out, b * N + j, eos) == REPLY + [eos] for j in (2, 3))


def test_use_dataset_target_false_pads_every_trace_and_slots_are_on_policy(
    compose_config, tiny_model_dir, tiny_task_dir, tokenizer, tmp_path
):
    """``use_dataset_target=False`` pads every trace: the prefix slots find none and the engine fills them all."""
    trainer, group = _trainer(
        compose_config,
        tiny_model_dir,
        tiny_task_dir,
        tokenizer,
        tmp_path,
        f"{tiny_task_dir}/train.parquet",
        OffPolicyPool(tokenizer=tokenizer, use_dataset_target=False),
    )
    out, _, _, _ = _rollout(trainer)
    assert group.sent["tgt_input_ids"] == ((4, N, MAX_PREFIX), torch.long) and "behaviour_log_probs" not in group.sent
    assert not out.batch["prefix_mask"].any() and "behaviour_log_probs" not in out.batch.keys()
    assert all(_response(out, k, tokenizer.eos_token_id) == REPLY + [tokenizer.eos_token_id] for k in range(4 * N))
