"""verl/utils/batch_sizes.py: the per-rank sizes the actor works in, hand-computed, and the config left alone.

The config keys count prompts (LUFFY/verl); ``RankBatchSizes`` carries the rows per data-parallel rank
(dp = world / SP) after ``x rollout.n``. These cases pin the numbers the actor received before the keys
stopped being overwritten in place.
"""

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.utils.batch_sizes import BatchSizeError, RankBatchSizes, rank_batch_sizes


@pytest.mark.parametrize(
    "actor,n,world,sp,log_prob,expected",
    [
        # LUFFY's run: 64 prompts x 8 / 8 ranks = 64 rows; log-prob 128 // 8 * 8 = 128.
        ({"ppo_mini_batch_size": 64, "ppo_micro_batch_size": 64}, 8, 8, 1, 128, (64, 64, 1, 128)),
        # n > 1 on 2 ranks: 4 x 4 / 2 = 8 rows, micro 2 x 4 / 2 = 4 rows, accumulate 2; log-prob 6 // 2 * 4 = 12.
        ({"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 2}, 4, 2, 1, 6, (8, 4, 2, 12)),
        # Ulysses SP=2 on 8 ranks: dp = 4, so 64 x 8 / 4 = 128 rows, 16 x 8 / 4 = 32; log-prob 128 // 4 * 8 = 256.
        ({"ppo_mini_batch_size": 64, "ppo_micro_batch_size": 16}, 8, 8, 2, 128, (128, 32, 4, 256)),
        # SP=2 on 2 ranks (dp = 1) with n = 2: 3 x 2 = 6 rows, micro 1 x 2 = 2, accumulate 3; log-prob 5 // 1 * 2 = 10.
        ({"ppo_mini_batch_size": 3, "ppo_micro_batch_size": 1}, 2, 2, 2, 5, (6, 2, 3, 10)),
        # ppo_micro_batch_size_per_gpu is rows already and wins over the prompt count.
        (
            {"ppo_mini_batch_size": 64, "ppo_micro_batch_size": 64, "ppo_micro_batch_size_per_gpu": 16},
            8,
            8,
            1,
            None,
            (64, 16, 4, None),
        ),
    ],
)
def test_rank_batch_sizes_hand_computed(actor, n, world, sp, log_prob, expected):
    sizes = rank_batch_sizes(OmegaConf.create(actor), n, world, sp, log_prob_micro_batch_size=log_prob)
    assert (
        sizes.ppo_mini_rows,
        sizes.ppo_micro_rows,
        sizes.gradient_accumulation,
        sizes.log_prob_micro_rows,
    ) == expected


def test_rank_batch_sizes_are_frozen_and_standalone_defaults_make_prompts_rows():
    sizes = rank_batch_sizes({"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 2})
    assert sizes == RankBatchSizes(ppo_mini_rows=4, ppo_micro_rows=2, gradient_accumulation=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sizes.ppo_mini_rows = 8
    with pytest.raises(BatchSizeError, match="ppo_mini_batch_size"):
        rank_batch_sizes({"ppo_mini_batch_size": 3, "ppo_micro_batch_size": 1}, rollout_n=1, world_size=2)


def _worker_config(sp: int):
    from luffy_pool.config.compose import compose_config

    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return compose_config(
        [
            f"{a}.ppo_mini_batch_size=8",
            f"{a}.ppo_micro_batch_size=4",
            f"{a}.ulysses_sequence_parallel_size={sp}",
            f"{r}.n=3",
            f"{r}.log_prob_micro_batch_size=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size=8",
        ]
    ).actor_rollout_ref


@pytest.mark.parametrize("sp,expected", [(1, (6, 3, 2, 6)), (2, (12, 6, 2, 12))])
def test_worker_keeps_the_prompt_counts_and_carries_rows_per_rank(monkeypatch, sp, expected):
    """4 ranks, n = 3: SP=1 -> dp 4: 8*3/4 = 6, 4*3/4 = 3, log-prob 8//4*3 = 6; SP=2 -> dp 2: 12, 6, 8//2*3 = 12."""
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    for k, v in dict(RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="4").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(ActorRolloutRefWorker, "_init_distributed", lambda self: None)
    from verl.workers.config_sections import WorkerSections

    sections = WorkerSections.from_config(_worker_config(sp))
    worker = ActorRolloutRefWorker(sections, role="actor_rollout_ref", device="cpu")
    b = worker.batch_sizes
    assert (b.ppo_mini_rows, b.ppo_micro_rows, b.gradient_accumulation, b.log_prob_micro_rows) == expected
    assert worker.sections == sections  # nothing rewritten
    assert (worker.sections.actor.ppo_mini_batch_size, worker.sections.rollout.n) == (8, 3)  # still prompts
    for section in (worker.sections.rollout, worker.sections.ref):  # the rollout's size serves the ref pass too
        assert worker._log_prob_meta(section)["micro_batch_size"] == expected[3]


def test_actor_update_splits_by_the_rank_sizes_not_the_prompt_counts(monkeypatch):
    from verl.workers.actor import dp_actor

    seen = {"micro_sizes": [], "losses": 0, "grads": []}
    from luffy_pool.config.compose import actor_config
    from verl.workers.config_sections import ActorSection

    cfg = actor_config(
        ppo_mini_batch_size=1,
        ppo_micro_batch_size=1,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=64,
        ppo_epochs=1,
        grad_clip=1.0,
    )
    param = torch.nn.Parameter(torch.zeros(1))
    actor = dp_actor.DataParallelPPOActor.__new__(dp_actor.DataParallelPPOActor)
    actor.config, actor.batch_sizes = cfg, RankBatchSizes(ppo_mini_rows=4, ppo_micro_rows=2, gradient_accumulation=2)
    actor.update_config = ActorSection.from_actor_config(cfg)
    actor.actor_module, actor.actor_optimizer = torch.nn.Linear(1, 1), torch.optim.SGD([param], lr=0.1)
    actor.device, actor.nonfinite_skips, actor.dp_group = "cpu", 0, None
    actor.pipeline = actor.router_recorder = None  # neither pipeline parallel nor an MoE router
    actor.loss_input_keys = lambda: ["input_ids", "attention_mask", "responses", "old_log_probs"]

    def micro_batches(mini, keys, micro_size, *_a):
        seen["micro_sizes"].append((len(mini), micro_size))
        return [{k: v for k, v in part.batch.items()} for part in mini.split(micro_size)], None

    def loss(mb, log_prob, entropy, mask, global_steps=None, update_state=None):
        seen["losses"] += 1
        return (param * log_prob).sum(), {}

    actor._micro_batches = micro_batches
    actor._forward_micro_batch = lambda mb, t, calculate_entropy: (
        torch.zeros(len(mb["input_ids"]), 2),
        torch.ones(len(mb["input_ids"]), 2),
    )
    actor.compute_policy_loss = loss
    actor._regularisers = lambda *a: 0.0
    actor._optimizer_step = lambda: seen["grads"].append(float(param.grad)) or 0.0
    rows = 8
    data = DataProto.from_dict(
        tensors={
            "input_ids": torch.ones(rows, 5, dtype=torch.long),
            "attention_mask": torch.ones(rows, 5, dtype=torch.long),
            "responses": torch.ones(rows, 2, dtype=torch.long),
            "old_log_probs": torch.zeros(rows, 2),
        },
        meta_info={"temperature": 1.0},
    )
    metrics = actor.update_policy(data)
    assert seen["micro_sizes"] == [(4, 2), (4, 2)]  # 8 rows -> two mini-batches of 4 rows, micro-batches of 2
    assert len(metrics["actor/grad_norm"]) == 2 and seen["losses"] == 4
    # d(loss)/d(param) = 2 rows x 2 tokens = 4 per micro-batch; two micro-batches each divided by
    # gradient_accumulation = 2 give 4 per optimizer step (8 if the divisor were 1).
    assert seen["grads"] == [4.0, 4.0]
