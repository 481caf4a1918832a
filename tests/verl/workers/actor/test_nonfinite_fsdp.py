"""Non-finite handling on 2 FSDP2 ranks: a NaN loss on ONE rank makes BOTH ranks skip the step.

The grad norm is reduced over all ranks, so every rank sees the same non-finite value and takes the
same decision; a rank that stepped while the other skipped would silently desynchronise the shards.
"""

from __future__ import annotations

import pytest
import torch
from luffy_pool.config.compose import actor_config

from tests.helpers.distributed_testing import load_fully_sharded, run_gloo_ranks


def _nan_on_rank_one(rank, world_size, port, model_dir):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from verl.protocol import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    model = load_fully_sharded(model_dir, mesh)
    cfg = actor_config(
        ppo_mini_batch_size=2,
        ppo_micro_batch_size=2,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=64,
        ppo_epochs=1,
        clip_ratio=0.2,
        entropy_coeff=0.0,
        grad_clip=1.0,
        use_kl_loss=False,
        on_nonfinite="skip",
    )
    actor = DataParallelPPOActor(cfg, model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(3, model.config.vocab_size, (2, 10), generator=g)
    attn = torch.ones_like(ids)
    adv = torch.ones(2, 4) if rank == 0 else torch.full((2, 4), float("nan"))
    data = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": attn.cumsum(-1) - 1,
            "responses": ids[:, 6:],
            "old_log_probs": torch.zeros(2, 4),
            "advantages": adv,
        },
        meta_info={"temperature": 1.0},
    )
    before = [p.to_local().clone() for p in model.parameters()]
    metrics = actor.update_policy(data)
    unchanged = all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
    adv_ok = torch.ones(2, 4)
    data.batch["advantages"] = adv_ok
    metrics_ok = actor.update_policy(data)
    moved = not all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
    dist.destroy_process_group()
    return {
        "unchanged": unchanged,
        "skips": metrics["actor/nonfinite_skips"],
        "moved_after": moved,
        "skips_after": metrics_ok["actor/nonfinite_skips"],
    }


@pytest.mark.slow  # forks gloo ranks that import torch + transformers
def test_nan_on_one_rank_skips_the_step_on_every_rank(tiny_model_dir):
    # a rank stepping alone would hang (TimeoutError) or desynchronise the shards
    results = run_gloo_ranks(_nan_on_rank_one, 2, tiny_model_dir, timeout_s=600)
    for rank, r in enumerate(results):
        assert r["unchanged"] and r["skips"] == [1], rank
        assert r["moved_after"] and r["skips_after"] == [1], rank  # the next finite step trains normally
