"""Self-replay in the step: failed groups get a kept success in the right slot, successes are kept with their
behaviour log-probs, and the trainer's config wiring (keys, checks)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from luffy_pool.replay.buffer import SelfReplayBuffer
from luffy_pool.replay.self_replay import SelfReplay, keep_successes, replay_into_failed_groups
from verl.protocol import DataProto

EOS, PAD, P, L = 2, 0, 2, 5


def _batch(responses, scores, index, prefix_len=None, uids=None):
    """Rows of a rollout: prompt [7, 8] ++ response; score on the last valid token."""
    rows = len(responses)
    resp = torch.full((rows, L), PAD, dtype=torch.long)
    mask = torch.zeros((rows, L), dtype=torch.long)
    prefix = torch.zeros((rows, L), dtype=torch.bool)
    tls = torch.zeros((rows, L))
    for i, r in enumerate(responses):
        resp[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        prefix[i, : (prefix_len or [0] * rows)[i]] = True
        tls[i, len(r) - 1] = scores[i]
    prompts = torch.tensor([[7, 8]] * rows)
    tensors = {
        "prompts": prompts,
        "responses": resp,
        "input_ids": torch.cat([prompts, resp], -1),
        "attention_mask": torch.cat([torch.ones(rows, P, dtype=torch.long), mask], -1),
        "response_mask": mask.clone(),
        "prefix_mask": prefix,
        "token_level_scores": tls,
    }
    uids = uids or [f"g{i // 3}" for i in range(rows)]
    return DataProto.from_dict(tensors, {"uid": np.array(uids, dtype=object), "index": np.array(index, dtype=object)})


class CountingReward:
    """Grades a row 1.0 when its response contains token 9 (the replayed success), counting calls."""

    def __init__(self):
        self.rows = 0

    def __call__(self, batch):
        self.rows += len(batch)
        scores = torch.zeros(batch.batch["responses"].shape)
        for i, r in enumerate(batch.batch["responses"]):
            valid = int(batch.batch["attention_mask"][i, P:].sum())
            scores[i, valid - 1] = float(9 in r[:valid].tolist())
        return scores, {}


def _replay(batch, buf, step, slots=1, ratios=None, reward=None):
    return replay_into_failed_groups(
        batch,
        buf,
        step,
        slots=slots,
        success=1.0,
        reward_fn=reward or CountingReward(),
        eos_token_id=EOS,
        pad_token_id=PAD,
        prefix_ratios=ratios,
    )


def test_failed_group_gets_the_kept_trace_in_its_last_on_policy_row():
    buf = SelfReplayBuffer()
    buf.insert(10, [9, 4], [-0.5, -1.0, -0.25], step=2)
    # group g0 (prompt 10): all three on-policy rows fail; group g1 (prompt 11): one success.
    batch = _batch(
        [[3, EOS], [3, 3, EOS], [4, EOS], [5, EOS], [9, EOS], [4, 4, EOS]], [0, 0, 0, 0, 1, 0], [10, 10, 10, 11, 11, 11]
    )
    reward = CountingReward()
    m = _replay(batch, buf, step=5, reward=reward)
    assert m["replay/used"] == 1 and m["replay/age_mean"] == 3 and m["replay/replayed_score"] == 1.0
    assert m["replay/generated_on_score"] == pytest.approx(1 / 6)
    assert reward.rows == 1  # only the rewritten row is regraded
    t = batch.batch
    assert t["responses"][2].tolist() == [9, 4, EOS, PAD, PAD]
    assert t["input_ids"][2].tolist() == [7, 8, 9, 4, EOS, PAD, PAD]
    assert t["attention_mask"][2].tolist() == [1, 1, 1, 1, 1, 0, 0]
    assert t["response_mask"][2].tolist() == [1, 1, 1, 0, 0]
    assert t["prefix_mask"][2].tolist() == [True, True, True, False, False]
    assert t["token_level_scores"][2].sum().item() == 1.0
    assert torch.allclose(t["behaviour_log_probs"][2, :3].double(), torch.tensor([-0.5, -1.0, -0.25]).double())
    assert torch.isnan(t["behaviour_log_probs"][2, 3:]).all() and torch.isnan(t["behaviour_log_probs"][:2]).all()
    assert t["responses"][:2].tolist() == [[3, EOS, PAD, PAD, PAD], [3, 3, EOS, PAD, PAD]]  # others untouched
    assert not t["prefix_mask"][3:].any()


def test_off_policy_slot_without_a_trace_is_filled_first_and_slots_bounds_the_rows():
    buf = SelfReplayBuffer()
    buf.insert(10, [9], [-0.1, -0.2], step=1)
    batch = _batch([[3, EOS], [4, EOS], [5, EOS]], [0, 0, 0], [10, 10, 10])
    ratios = np.array([[0.0, 1.0, 0.0]])  # slot 1 is an off-policy slot that got no trace (ran on-policy)
    m = _replay(batch, buf, step=2, slots=2, ratios=ratios)
    assert m["replay/used"] == 2
    replaced = [i for i in range(3) if batch.batch["prefix_mask"][i].any()]
    assert replaced == [1, 2]  # the empty off-policy slot, then the last on-policy row


def test_groups_with_a_success_or_a_teacher_success_only_and_empty_buffer_are_left_alone():
    buf = SelfReplayBuffer()
    buf.insert(10, [9], [-0.1, -0.2], step=1)
    # g0: teacher row (prefix) succeeded but every on-policy row failed -> replay; g1: prompt without kept trace.
    batch = _batch(
        [[9, EOS], [3, EOS], [4, EOS], [5, EOS], [6, EOS], [6, EOS]],
        [1, 0, 0, 0, 0, 0],
        [10, 10, 10, 12, 12, 12],
        prefix_len=[2, 0, 0, 0, 0, 0],
    )
    m = _replay(batch, buf, step=3)
    assert m["replay/used"] == 1
    assert batch.batch["prefix_mask"][0].any() and batch.batch["prefix_mask"][2].any()  # teacher kept, row 2 replaced
    assert not batch.batch["prefix_mask"][3:].any()
    assert (
        "behaviour_log_probs" in batch.batch.keys()
    )  # present every step: the actor reads it with use_off_policy_probs
    none_used = _replay(_batch([[3, EOS]] * 3, [0, 0, 0], [12] * 3), buf, step=3)
    assert none_used["replay/used"] == 0 and none_used["replay/age_mean"] == 0.0


def test_too_old_traces_are_not_replayed():
    buf = SelfReplayBuffer(max_age=2)
    buf.insert(10, [9], [-0.1, -0.2], step=1)
    m = _replay(_batch([[3, EOS]] * 3, [0, 0, 0], [10] * 3), buf, step=4)
    assert m["replay/used"] == 0 and m["replay/expired"] == 1 and len(buf) == 0


class _Tokens:
    eos_token_id, pad_token_id = EOS, PAD


def test_the_two_stages_rewrite_failed_groups_before_the_pass_and_keep_its_successes_after():
    """The step's two calls around its log-prob pass: the pass sees the replayed rows, and the buffer keeps this
    step's success with the old log-probs the pass computed (a trace kept this step is not replayed in it)."""
    buf = SelfReplayBuffer()
    buf.insert(10, [9, 4], [-0.5, -1.0, -0.25], step=1)
    replay = SelfReplay(buf, slots=1, success=1.0, reward_fn=CountingReward(), tokenizer=_Tokens())
    # g0 (prompt 10) fails everywhere -> its last row gets the kept trace; g1 (prompt 11) has one success.
    batch = _batch(
        [[3, EOS], [3, EOS], [4, EOS], [5, EOS], [9, EOS], [4, EOS]], [0, 0, 0, 0, 1, 0], [10, 10, 10, 11, 11, 11]
    )
    before = replay.fill_failed_groups(batch, 3, np.zeros((2, 3)))
    assert batch.batch["responses"][2].tolist() == [9, 4, EOS, PAD, PAD]  # rewritten in place, before the pass
    assert before["replay/used"] == 1 and len(buf) == 1  # nothing of this step is kept before the pass
    batch.batch["old_log_probs"] = torch.full(batch.batch["responses"].shape, -0.75)  # what the pass adds
    after = replay.keep_successes(batch, 3)
    assert after["replay/inserted"] == 1 and after["replay/size"] == 2
    assert buf.entries(11)[0].token_ids == [9] and buf.entries(11)[0].logprobs == [-0.75, -0.75]
    assert not set(before) & set(after)  # the step's replay/* metrics come from one stage each


def test_replay_is_built_only_when_enabled(compose_config):
    from luffy_pool.config.sections import ConfigSections

    off = ConfigSections.from_config(compose_config([]))
    assert SelfReplay.from_sections(off, reward_fn=CountingReward(), tokenizer=_Tokens()) is None
    on = ConfigSections.from_config(compose_config(["data.self_replay.enable=True", "data.self_replay.slots=2"]))
    replay = SelfReplay.from_sections(on, reward_fn=CountingReward(), tokenizer=_Tokens())
    assert replay.slots == 2 and replay.success == 1.0 and len(replay.buffer) == 0


def test_keep_successes_records_on_policy_successes_with_old_log_probs():
    buf = SelfReplayBuffer(max_per_prompt=4)
    batch = _batch(
        [[9, 4, EOS], [3, EOS], [9, 9, 9, 9, 9], [9, EOS], [9, EOS], [5, EOS]],
        [1, 0, 1, 1, 1, 0],
        [10, 10, 10, 11, 11, 11],
        prefix_len=[0, 0, 0, 2, 0, 0],
    )
    old = torch.arange(6 * L, dtype=torch.float32).view(6, L) * -0.01
    batch.batch["old_log_probs"] = old
    m = keep_successes(batch, buf, step=4, success=1.0, eos_token_id=EOS)
    assert m["replay/inserted"] == 3 and m["replay/size"] == 3 and m["replay/prompts"] == 2
    first, truncated = buf.entries(10)
    assert first.token_ids == [9, 4] and first.step == 4
    assert first.logprobs == pytest.approx(old[0, :3].double().tolist())  # tokens ++ EOS
    assert truncated.token_ids == [9] * 5 and math.isnan(truncated.logprobs[-1])  # no EOS sampled
    assert [e.token_ids for e in buf.entries(11)] == [[9]]  # the teacher row (prefix) is not kept


def test_keep_successes_falls_back_to_engine_log_probs_then_unknown():
    buf = SelfReplayBuffer()
    batch = _batch([[9, EOS]], [1], [1], uids=["g"])
    batch.batch["rollout_log_probs"] = torch.full((1, L), -0.7)
    keep_successes(batch, buf, step=1, success=1.0, eos_token_id=EOS)
    assert buf.entries(1)[0].logprobs == pytest.approx([-0.7, -0.7])
    buf2 = SelfReplayBuffer()
    keep_successes(_batch([[9, EOS]], [1], [1], uids=["g"]), buf2, step=1, success=1.0, eos_token_id=EOS)
    assert all(math.isnan(v) for v in buf2.entries(1)[0].logprobs)


# ---------------------------------------------------------------- config
def test_self_replay_keys_are_documented_off_by_default_and_checked(compose_config):
    from luffy_pool.config.check import validate_config

    required = ["data.train_files=t.parquet", "data.val_files=v.parquet", "actor_rollout_ref.model.path=m"]
    cfg = compose_config(required)
    assert cfg.data.self_replay.enable is False and validate_config(cfg) == []
    assert set(cfg.data.self_replay) == {
        "enable",
        "capacity",
        "max_per_prompt",
        "eviction",
        "max_age",
        "selection",
        "slots",
    }
    on = required + [
        "data.self_replay.enable=True",
        "actor_rollout_ref.actor.use_off_policy_loss=True",
        "actor_rollout_ref.actor.use_off_policy_probs=True",
    ]
    assert validate_config(compose_config(on)) == []

    def errors(extra):
        return "\n".join(validate_config(compose_config(extra)))

    assert "'data.self_replay.enable'=True needs" in errors(on[:-1])
    assert "data.self_replay.eviction" in errors(on + ["data.self_replay.eviction=lru"])
    assert "'data.self_replay.max_age'=-2 must be -1 (no limit) or >= 0" in errors(on + ["data.self_replay.max_age=-2"])
    assert "'data.self_replay.capacity'=0 must be >= 1" in errors(on + ["data.self_replay.capacity=0"])
    assert "did you mean 'data.self_replay.max_age'" in errors(on + ["+data.self_replay.max_agee=3"])


# ---------------------------------------------------------------- checkpoint / resume through fit
class _Crash(RuntimeError):
    pass


class _FileWorkers:
    """Stands in for the worker group: the actor 'checkpoint' is one file, so only the driver state matters."""

    world_size = 1

    def save_checkpoint(self, path, global_step=None, **kw):
        import os

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "marker.txt"), "w") as f:
            f.write(str(global_step))

    def load_checkpoint(self, path):
        pass

    def save_hf_model(self, path):
        pass


def _replay_trainer(base_config, out_dir, crash_at=None, steps=7):
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader

    from luffy_pool.run.checkpointing import TrainerCheckpointer
    from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer, StepOutput
    from verl.utils.dataset.sampler import ResumableRandomSampler

    class Scripted(MIXRayPPOTrainer):
        """The real fit loop; a step inserts traces derived from its prompts and samples the buffer."""

        def rollout_step(self, timing):  # fit's step: draws its batch, then the scripted update
            batch_dict = self._next_batch()
            if self.global_steps == crash_at:
                raise _Crash(f"killed in step {self.global_steps}")
            buffer = self.self_replay.buffer
            for i in batch_dict["index"]:
                picked = buffer.sample(int(i), self.global_steps)
                self.picks.append((self.global_steps, int(i), None if picked is None else picked.token_ids))
                tokens = [int(i), self.global_steps % 3, 5]
                buffer.insert(int(i), tokens, [-0.1 * self.global_steps] * 4, self.global_steps)
            return StepOutput({}, 1, 1)

    cfg = OmegaConf.merge(
        base_config,
        {
            "trainer": {
                "default_local_dir": str(out_dir),
                "total_training_steps": steps,
                "save_freq": 2,
                "resume_mode": "auto",
            }
        },
    )
    sampler = ResumableRandomSampler(10, seed=47)
    loader = DataLoader(
        list(range(10)),
        batch_size=4,
        sampler=sampler,
        drop_last=True,
        collate_fn=lambda rows: {"index": np.asarray(rows)},
    )
    from luffy_pool.config.sections import ConfigSections

    trainer = Scripted(
        cfg,
        None,
        _FileWorkers(),
        None,
        None,
        loader,
        checkpointer=TrainerCheckpointer(ConfigSections.from_config(cfg), sampler),
    )
    trainer.picks = []
    return trainer


def test_kill_and_resume_restores_the_same_buffer(compose_config, tmp_path):
    base = compose_config(
        [
            "data.train_files=t",
            "data.val_files=v",
            "actor_rollout_ref.model.path=m",
            "data.train_batch_size=4",
            "trainer.test_freq=-1",
            "+trainer.val_before_train=False",
            "data.self_replay.enable=True",
            "data.self_replay.capacity=7",
            "data.self_replay.max_per_prompt=2",
            "data.self_replay.eviction=random",
            "data.self_replay.selection=random",
            "data.self_replay.max_age=3",
        ]
    )
    ref = _replay_trainer(base, tmp_path / "ref")
    ref.fit()
    crashed = _replay_trainer(base, tmp_path / "run", crash_at=5)
    with pytest.raises(_Crash):
        crashed.fit()
    assert (tmp_path / "run" / "global_step_4" / "self_replay" / "replay_buffer.safetensors").exists()
    resumed = _replay_trainer(base, tmp_path / "run")
    resumed.fit()
    assert resumed.picks[0][0] == 5  # continued after the step-4 checkpoint
    assert resumed.picks == [p for p in ref.picks if p[0] >= 5]
    snapshot = lambda t: [
        (k, e.token_ids, e.logprobs, e.step) for k, v in t.self_replay.buffer._entries.items() for e in v
    ]
    assert snapshot(resumed) == snapshot(ref) and len(ref.self_replay.buffer) > 0
    assert resumed.self_replay.buffer._inserts == ref.self_replay.buffer._inserts
